"""Splitting a submission into arrays (launch.slurm_arrays) and the `synthetic` work, without Slurm."""

from __future__ import annotations

from argparse import Namespace

import numpy as np
import pytest

from eagle_batch.launch.slurm_arrays import max_array_tasks, share_parallelism, split_tasks
from eagle_batch.launch.state import SubmitError


def test_split_tasks_near_equal_parts_within_the_limit():
    parts = split_tasks(range(2000), 1001)
    assert [len(p) for p in parts] == [1000, 1000]
    assert [t for p in parts for t in p] == list(range(2000))
    assert [len(p) for p in split_tasks(range(10), 3)] == [3, 3, 2, 2]
    assert split_tasks([4, 9], 1001) == [[4, 9]]
    assert split_tasks([], 5) == []


def test_parallelism_is_shared_so_the_total_stays_within_it():
    assert share_parallelism(64, 3) == [22, 21, 21]
    assert sum(share_parallelism(64, 3)) == 64
    assert share_parallelism(64, 1) == [64]
    assert share_parallelism(2, 3) == [1, 1, 1]  # an array runs at least one task


def test_configured_max_array_size_wins_and_a_negative_one_is_refused():
    assert max_array_tasks(7) == 7
    with pytest.raises(SubmitError, match="slurm.max_array_size=-1"):
        max_array_tasks(-1)


def test_synthetic_work_writes_the_plan_through_the_real_store_and_is_idempotent(tmp_path):
    from eagle_batch.bench.slurm_run import make_run, read_back
    from eagle_batch.launch import ArrayTask
    from eagle_batch.launch.state import DONE, read_state
    from eagle_batch.launch.synthetic_work import synthetic_work
    from eagle_batch.launch.work import resolve_work
    from eagle_batch.store import TaskStore

    assert resolve_work("synthetic") is synthetic_work
    args = Namespace(tasks=3, samples=4, sample_s=0.0, parallelism=4, max_array_size=0, nice=0)
    run = make_run(tmp_path, args)
    for t in range(3):
        assert ArrayTask(run, t)()["samples"] == 4
        assert read_state(run, t).status == DONE
    before = TaskStore(run / "stores" / "task-00001.zarr").sample_ids
    ArrayTask(run, 1)()  # done: nothing rewritten
    store = TaskStore(run / "stores" / "task-00001.zarr")
    assert store.sample_ids == before == [f"t1-s{i}" for i in range(4)]
    assert np.all(store.lengths >= 8)
    assert read_back(run, 3, 4) == {
        "samples_expected": 12,
        "samples_present": 12,
        "lost": 0,
        "duplicated": 0,
        "unexpected": 0,
        "data_mismatches": 0,
    }

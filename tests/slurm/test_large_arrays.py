"""A run larger than one array, on the REAL Slurm (`.ci/slurm-up.sh`; skipped when sbatch is missing).

`slurm.max_array_size` below the run's task count splits the submission into several arrays; `status`,
`cancel` and `resume` treat them as one run. The tasks run `extract.work=synthetic` (the real ArrayTask,
state files, store writer and commit protocol; no model). Slurm commands are counted (not timed): one
`status` asks sacct and squeue once each, whatever the number of arrays.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def jobs_import_this_tree(monkeypatch):
    # Jobs inherit the environment at sbatch time: they must run this tree's eagle_batch.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def cli(capsys, *argv) -> tuple[int, str, str]:
    from eagle_batch.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def synthetic_run(tmp_path: Path, n: int, max_array_size: int, sample_s: float) -> Path:
    from argparse import Namespace

    from eagle_batch.bench.slurm_run import make_run

    args = Namespace(tasks=n, samples=3, sample_s=sample_s, parallelism=64, max_array_size=max_array_size, nice=0)
    return make_run(tmp_path, args)


def submit(run: Path) -> list:
    from eagle_batch.config import load_run_config
    from eagle_batch.launch import submit_tasks
    from eagle_batch.launch.state import plan_num_tasks, read_submissions

    submit_tasks(load_run_config(run), run, list(range(plan_num_tasks(run))), kind="extract")
    return read_submissions(run)


def _states(status: dict, tasks: set[int]) -> dict[int, str]:
    return {r["task_id"]: r["state"] for r in status["tasks"] if r["task_id"] in tasks}


def test_a_run_split_into_arrays_survives_kills_and_cancels_and_resumes_exactly_those(tmp_path, capsys):
    from eagle_batch.bench.slurm_run import CallCounter, Faults, drain, element_tasks, read_back
    from eagle_batch.launch.state import read_submissions

    n = 45
    run = synthetic_run(tmp_path, n, max_array_size=15, sample_s=0.3)
    subs = submit(run)
    arrays = [s.job_id for s in subs]
    assert len(arrays) == 3 and [len(s.tasks) for s in subs] == [15, 15, 15]
    assert sorted(t for s in subs for t in s.tasks) == list(range(n))
    assert len({s.group for s in subs}) == 1 and subs[0].group == arrays[0]

    # Cancel three tasks before they finish, one of each array, through the CLI (it finds each task's array).
    pick = [5, 20, 35]
    rc, out, err = cli(capsys, "cancel", run, *[a for t in pick for a in ("--task", t)])
    assert rc == 0, err
    assert all(f"{a}_5" in out for a in arrays), out
    # Kill three tasks with kill -9 while they write (their state file names the live process).
    # Not the cancelled ones: a cancelled task may still run a moment (it commits on SIGTERM) and must not be
    # killed too, or it ends `cancelled`, not `failed`.
    faults = Faults(run, n, kill_n=3, cancel_n=0, rng=random.Random(1), spared=pick)
    drain(run, arrays, time.time() + 110, faults)
    assert len(faults.killed) == 3

    with CallCounter() as calls:
        rc, out, err = cli(capsys, "status", run, "--json")
    assert rc == 0, err
    assert calls.take() == {"sacct": 1, "squeue": 1}  # one of each for the three arrays
    st = json.loads(out)
    not_done = {r["task_id"] for r in st["tasks"] if r["state"] != "done"}
    assert not_done == faults.killed | set(pick), st["totals"]["states"]
    # Slurm's accounting may record a killed element's end a moment after squeue has dropped it.
    deadline = time.time() + 60
    while (killed := _states(st, faults.killed)) and set(killed.values()) != {"failed"} and time.time() < deadline:
        time.sleep(2)
        st = json.loads(cli(capsys, "status", run, "--json")[1])
    assert set(killed.values()) == {"failed"}, killed

    before = len(read_submissions(run))
    rc, out, err = cli(capsys, "resume", run)
    assert rc == 0, err + out
    resumed = read_submissions(run)[before:]
    assert sorted(t for s in resumed for t in s.tasks) == sorted(not_done)
    rc, out, err = cli(capsys, "resume", run)  # its tasks are queued or running: nothing to add
    assert rc == 0 and out.startswith("nothing to resume"), err + out
    assert len(read_submissions(run)) == before + len(resumed)

    drain(run, [s.job_id for s in resumed], time.time() + 60)
    rc, out, err = cli(capsys, "status", run, "--json")
    assert json.loads(out)["totals"]["all_done"], out
    data = read_back(run, n, samples=3)
    assert data["samples_present"] == data["samples_expected"] == 3 * n
    assert data["lost"] == data["duplicated"] == data["unexpected"] == data["data_mismatches"] == 0
    assert set(element_tasks(run).values()) == set(range(n))


def test_cancel_stops_every_array_of_the_run(tmp_path, capsys):
    from eagle_batch.bench.slurm_run import live_elements

    run = synthetic_run(tmp_path, 9, max_array_size=3, sample_s=30)
    subs = submit(run)
    arrays = [s.job_id for s in subs]
    assert len(arrays) == 3
    rc, out, err = cli(capsys, "cancel", run)
    assert rc == 0, err
    assert all(a in out for a in arrays), out
    deadline = time.time() + 30
    while live_elements(arrays) and time.time() < deadline:
        time.sleep(0.5)
    assert not live_elements(arrays)
    rc, out, err = cli(capsys, "resume", run, "--dry-run")
    assert rc == 0 and "resubmitting 9 task(s)" in out, out


def test_max_array_size_is_read_from_the_cluster():
    from eagle_batch.launch.slurm_arrays import cluster_max_array_size, max_array_tasks

    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    line = next(x for x in shown.splitlines() if x.startswith("MaxArraySize"))
    assert cluster_max_array_size() == int(line.split("=")[1]) == max_array_tasks(0)
    assert max_array_tasks(7) == 7

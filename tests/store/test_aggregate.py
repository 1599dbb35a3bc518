"""aggregate: dataset.json over 64 task stores in < 1 s; open_dataset over it; incomplete stores listed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from store_testlib import HIDDEN, LAYERS, make_sample

from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreMismatchError, StoreSpec, TaskStoreWriter, aggregate, open_dataset


def build_run(run, spec, n_stores, per_store, complete=True, cfg=None):
    cfg = cfg or StoreConfig(chunk_tokens=8, shard_tokens=32, fsync=False)  # fsync off: only building fixtures
    samples = []
    for s in range(n_stores):
        with TaskStoreWriter.open(run / "stores" / f"task-{s:05d}.zarr", spec, cfg, threads=1) as w:
            for i in range(per_store):
                x = make_sample(s * 1000 + i, max_len=12)
                w.append(*x)
                samples.append(x)
            w.commit()
            if complete:
                w.finalize()
    return samples


@pytest.fixture(scope="module")
def run64(tmp_path_factory):
    run = tmp_path_factory.mktemp("run64")
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN, model_name="synthetic", config_hash="h")
    samples = build_run(run, spec, 64, 3)
    return run, spec, samples


def test_aggregate_64_stores_under_one_second(run64):
    run, _, samples = run64
    aggregate(run)  # warm the page cache like a second look at a finished run
    t0 = time.perf_counter()
    index = aggregate(run)
    seconds = time.perf_counter() - t0
    assert seconds < 1.0, f"aggregating 64 stores took {seconds:.2f} s"
    assert len(index["stores"]) == 64 and index["num_samples"] == len(samples)


def test_reader_over_aggregated_run(run64):
    run, _, samples = run64
    aggregate(run)
    ds = open_dataset(run)
    assert len(ds) == len(samples)
    for i in (0, 1, 95, len(samples) - 1):
        x = ds[i]
        assert x["sample_id"] == samples[i][0]
        np.testing.assert_array_equal(x["hidden_states"].view(dtype=__import__("torch").uint16).numpy(), samples[i][3])
        np.testing.assert_array_equal(x["input_ids"].numpy(), samples[i][1])
    assert ds.lengths().tolist() == [len(s[1]) for s in samples]
    sub = ds.with_layers([LAYERS[-1]])
    np.testing.assert_array_equal(sub.get_arrays(7)["hidden_states"], samples[7][3][:, [-1]])


def test_incomplete_stores_listed_and_cli(tmp_path):
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN)
    build_run(tmp_path, spec, 2, 2)
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, fsync=False)
    with TaskStoreWriter.open(tmp_path / "stores" / "task-00002.zarr", spec, cfg) as w:
        w.append(*make_sample(99))
        w.commit()
    r = subprocess.run(
        [sys.executable, "-m", "eagle_batch", "aggregate", str(tmp_path), "--require-all"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "incomplete: stores/task-00002.zarr (1 samples committed)" in r.stderr, r.stderr
    index = json.loads((tmp_path / "dataset.json").read_text())
    assert [e["path"] for e in index["stores"]] == ["stores/task-00000.zarr", "stores/task-00001.zarr"]
    assert len(open_dataset(tmp_path)) == 4


def test_mismatched_stores_refused(tmp_path):
    build_run(tmp_path, StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN, config_hash="a"), 1, 1)
    other = tmp_path / "other"
    build_run(other, StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN, config_hash="b"), 1, 1)
    shutil.move(other / "stores" / "task-00000.zarr", tmp_path / "stores" / "task-00001.zarr")
    with pytest.raises(StoreMismatchError, match="config_hash"):
        aggregate(tmp_path)

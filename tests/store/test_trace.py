"""store.trace_dir: a writer's timeline of appends, encodes, shard writes and commits."""

import json

import numpy as np

from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec, TaskStoreWriter
from eagle_batch.store.ingest import Ingest


def _write(path, n=12, trace_dir=""):
    spec = StoreSpec(layer_ids=[1, 2], hidden_size=32, model_name="t")
    cfg = StoreConfig(chunk_tokens=16, shard_tokens=64, fsync=False, adaptive=False, trace_dir=trace_dir)
    rng = np.random.default_rng(0)
    with TaskStoreWriter.open(path, spec, cfg) as w:
        for i in range(n):
            t = 40
            w.append(
                f"s{i}",
                rng.integers(0, 100, t),
                np.ones(t, np.uint8),
                rng.integers(0, 1 << 16, (t, 2, 32), dtype=np.uint16),
            )
            if i == 5:
                w.commit()
        w.finalize()


def test_trace_records_every_stage_in_order(tmp_path):
    _write(tmp_path / "s.zarr", trace_dir=str(tmp_path / "trace"))
    files = list((tmp_path / "trace").glob("*.jsonl"))
    assert len(files) == 1
    ev = [json.loads(line) for line in files[0].read_text().splitlines()]
    kinds = {e["ev"] for e in ev}
    assert kinds - {"gil"} == {"append", "encode", "shard", "commit"}
    for e in ev:
        if e["ev"] == "gil":  # the interpreter-latency sampler's windows (only if the write ran > 0.1 s)
            assert e["n"] > 0 and e["late_max_ms"] >= e["late_ms"] > -1.0
    assert [e["sample"] for e in ev if e["ev"] == "append"] == [f"s{i}" for i in range(12)]
    hs = [e for e in ev if e["ev"] == "encode" and e["array"] == "hidden_states"]
    assert len(hs) == 12 * 40 // 16 and all(e["nbytes"] == 16 * 2 * 32 * 2 for e in hs)
    for e in ev:
        assert e["t0"] <= e["t"]
    full = [e for e in ev if e["ev"] == "shard" and e["array"] == "hidden_states" and e["full"]]
    assert sorted(e["shard"] for e in full) == list(range(12 * 40 // 64))
    for e in full:
        assert e["t0"] <= e["ready"] <= e["t"] and e["nbytes"] > 0
    assert sum(e["ev"] == "commit" for e in ev) == 2  # the explicit one and finalize's


def test_no_trace_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "s.zarr", n=3)
    assert not list(tmp_path.rglob("*.jsonl"))


def test_lent_whole_chunks_go_a_few_per_job_within_one_shard(tmp_path, monkeypatch):
    """Lent rows: one compression job takes several whole chunks (each job costs interpreter time on several
    threads), never past its shard's end (shards are submitted when full) nor over JOB_BYTES."""
    chunk_bytes = 16 * 2 * 32 * 2
    monkeypatch.setattr(Ingest, "JOB_BYTES", 3 * chunk_bytes)
    spec = StoreSpec(layer_ids=[1, 2], hidden_size=32, model_name="t")
    cfg = StoreConfig(chunk_tokens=16, shard_tokens=64, fsync=False, adaptive=False, trace_dir=str(tmp_path / "trace"))
    rng = np.random.default_rng(1)
    released = []
    with TaskStoreWriter.open(tmp_path / "s.zarr", spec, cfg) as w:
        for i, t in enumerate([100, 7, 130, 64]):
            hs = rng.integers(0, 1 << 16, (t, 2, 32), dtype=np.uint16)
            w.append(f"s{i}", np.arange(t), np.ones(t, np.uint8), hs, on_release=lambda i=i: released.append(i))
        w.finalize()
    assert sorted(released) == [0, 1, 2, 3]
    ev = [json.loads(line) for f in (tmp_path / "trace").glob("*.jsonl") for line in f.read_text().splitlines()]
    jobs = [e for e in ev if e["ev"] == "encode" and e["array"] == "hidden_states"]
    assert sum(e["chunks"] for e in jobs) == 301 // 16  # every full chunk encoded once (the last 13 rows: tail)
    assert max(e["chunks"] for e in jobs) == 3 and all(e["nbytes"] == e["chunks"] * chunk_bytes for e in jobs)
    assert len(jobs) < 301 // 16
    # Worked through by hand (jobs finish in any order, so as a multiset): sample 0's 6 whole chunks go as 3 + 1
    # (shard 0 ends) + 2; sample 2 starts with a chunk completed in our buffer (1), then 1 (shard end), 3, 1, 2;
    # sample 3 likewise 1 (buffer), 1, 2.
    assert sorted(e["chunks"] for e in jobs) == [1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3]

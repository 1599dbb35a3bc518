"""verify catches each kind of damage, names store and shard, and lists the samples a shard covers."""

from __future__ import annotations

import subprocess
import sys

import pytest
from store_testlib import make_sample

from eagle_batch.store import TaskStoreWriter, read_record, verify
from eagle_batch.store.crc import sealed


@pytest.fixture
def store(tmp_path, spec, small_cfg):
    path = tmp_path / "task-00000.zarr"
    with TaskStoreWriter.open(path, spec, small_cfg) as w:
        for i in range(12):
            w.append(*make_sample(i))
        w.finalize()
    return path


def shard_file(store, k=1):
    return store / "hidden_states" / "c" / str(k) / "0" / "0"


def test_clean_store_has_no_problems(store):
    assert verify(store) == []


def test_flipped_byte(store):
    f = shard_file(store)
    data = bytearray(f.read_bytes())
    data[len(data) // 3] ^= 0x01
    f.write_bytes(bytes(data))
    (p,) = verify(store)
    assert (p.kind, p.array, p.shard) == ("checksum", "hidden_states", 1)
    r = read_record(store)
    first, last = p.samples[0], p.samples[-1]
    bounds = [sum(r["lengths"][:i]) for i in range(len(r["lengths"]) + 1)]
    # The listed samples are exactly those whose tokens overlap shard 1 (tokens 32..63).
    assert bounds[first] < 64 and bounds[first + 1] > 32 and bounds[last] < 64 and bounds[last + 1] > 32
    assert p.sample_ids == [r["sample_ids"][i] for i in p.samples]


def test_truncated_shard(store):
    f = shard_file(store, 0)
    f.write_bytes(f.read_bytes()[:-10])
    (p,) = verify(store)
    assert (p.kind, p.array, p.shard) == ("truncated", "hidden_states", 0)


def test_missing_shard(store):
    (store / "loss_mask" / "c" / "2").unlink()
    (p,) = verify(store)
    assert (p.kind, p.array, p.shard) == ("missing", "loss_mask", 2)


def test_stray_partial(store):
    (store / "input_ids" / "c" / "0.abc123.partial").write_bytes(b"x")
    (p,) = verify(store)
    assert p.kind == "stray" and p.file.endswith(".partial")


def test_record_pointing_past_the_data(store):
    import json

    r = json.loads((store / "progress.json").read_text())
    r["lengths"][-1] += 40
    r["num_tokens"] += 40
    (store / "progress.json").write_text(json.dumps(sealed(r)))  # as a writer would seal it
    kinds = {(p.kind, p.array) for p in verify(store)}
    assert ("record", "hidden_states") in kinds  # the shard table does not cover the claimed tokens


def test_nan_in_hidden_states_reported(tmp_path, spec, small_cfg):
    sid, ids, mask, hs = make_sample(0)
    hs = hs.copy()
    hs[0, 0, 0] = 0x7FC0  # NaN
    hs[-1, 0, 1] = 0xFF80  # -Inf
    with TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg) as w:
        w.append(sid, ids, mask, hs)
        w.finalize()
    problems = verify(tmp_path / "s.zarr")
    assert problems and all(p.kind == "values" for p in problems)
    assert sum("NaN" in p.message for p in problems) >= 1


def test_cli_exit_code_names_store_and_shard(store):
    f = shard_file(store, 1)
    data = bytearray(f.read_bytes())
    data[5] ^= 0xFF
    f.write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "-m", "eagle_batch", "verify", str(store)], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "task-00000.zarr: hidden_states shard 1" in r.stdout and "checksum" in r.stdout


def test_repair_truncates_before_the_damaged_shard_and_resume_recomputes(store, spec, small_cfg):
    import numpy as np

    from eagle_batch.store import StoreCorruptError, open_dataset

    samples = [make_sample(i) for i in range(12)]
    (store / "hidden_states" / "c" / "2" / "0" / "0").unlink()
    (damaged,) = verify(store)
    with pytest.raises(StoreCorruptError, match="shard 2"):
        TaskStoreWriter.open(store, spec, small_cfg)
    with pytest.warns(UserWarning, match="repair drops"):
        w = TaskStoreWriter.open(store, spec, small_cfg, repair=True)
    with w:
        assert w.num_committed == damaged.samples[0]  # everything before the first sample touching shard 2 kept
        assert not w.is_complete
        for s in samples:
            if s[0] not in w.committed_sample_ids:
                w.append(*s)
        w.finalize()
    assert verify(store) == []
    ds = open_dataset(store)
    for i, s in enumerate(samples):
        np.testing.assert_array_equal(ds.get_arrays(i)["hidden_states"], s[3])


def test_writer_refuses_record_pointing_past_the_data(store, spec, small_cfg):
    import json

    from eagle_batch.store import StoreCorruptError

    r = json.loads((store / "progress.json").read_text())
    r["lengths"].append(50)
    r["sample_ids"].append("ghost")
    r["num_samples"] += 1
    r["num_tokens"] += 50
    (store / "progress.json").write_text(json.dumps(sealed(r)))  # as a writer would seal it
    (store / "complete").unlink()
    with pytest.raises(StoreCorruptError, match="does not cover"):
        TaskStoreWriter.open(store, spec, small_cfg)

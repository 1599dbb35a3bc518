"""TaskStoreWriter + open_dataset: bit-exact round trips, resume, lock, and what plain zarr sees."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from store_testlib import HIDDEN, LAYERS, make_sample

from eagle_batch.config import StoreConfig
from eagle_batch.store import (
    StoreLockedError,
    StoreMismatchError,
    StoreSpec,
    TaskStoreWriter,
    open_dataset,
    read_record,
)


def write_store(path, spec, cfg, samples, commit_every=3, finalize=True):
    with TaskStoreWriter.open(path, spec, cfg) as w:
        for j, s in enumerate(samples):
            if s[0] in w.committed_sample_ids:
                continue
            w.append(*s)
            if j % commit_every == commit_every - 1:
                w.commit()
        w.commit()
        if finalize:
            w.finalize()


def assert_matches(ds, samples):
    assert len(ds) == len(samples)
    for i, (sid, ids, mask, hs) in enumerate(samples):
        x = ds[i]
        assert x["sample_id"] == sid
        assert x["hidden_states"].dtype == torch.bfloat16
        np.testing.assert_array_equal(x["hidden_states"].view(torch.uint16).numpy(), hs)
        np.testing.assert_array_equal(x["input_ids"].numpy(), ids)
        np.testing.assert_array_equal(x["loss_mask"].numpy(), mask)


ALL_BF16_PATTERNS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


@pytest.mark.parametrize("codec", ["blosc-zstd", "zstd", "none"])
def test_every_bf16_bit_pattern_round_trips(tmp_path, spec, codec):
    """All 65536 bf16 encodings (every NaN payload, +-Inf, -0, subnormals) survive writer -> reader and plain zarr."""
    row = len(LAYERS) * HIDDEN
    t = -(-ALL_BF16_PATTERNS.size // row)
    hs = np.resize(ALL_BF16_PATTERNS, t * row).reshape(t, len(LAYERS), HIDDEN)
    sample = ("all-patterns", np.arange(t, dtype=np.int32), np.ones(t, np.uint8), hs)
    cfg = StoreConfig(codec=codec, chunk_tokens=64, shard_tokens=256)
    write_store(tmp_path / "s.zarr", spec, cfg, [sample])
    assert_matches(open_dataset(tmp_path / "s.zarr"), [sample])
    plain = zarr.open_array(tmp_path / "s.zarr" / "hidden_states", mode="r")
    assert str(plain.dtype) == "bfloat16"
    np.testing.assert_array_equal(plain[:].view(np.uint16), hs)


def test_torch_special_values_bit_exact(tmp_path, spec, small_cfg):
    specials = torch.tensor(
        [
            float("nan"),
            float("inf"),
            float("-inf"),
            -0.0,
            0.0,
            1e-40,
            -1e-40,
            3.0e38,
            torch.finfo(torch.bfloat16).tiny / 4,
        ],
        dtype=torch.bfloat16,
    )
    hs = specials.repeat(len(LAYERS) * HIDDEN * 2)[: 2 * len(LAYERS) * HIDDEN].reshape(2, len(LAYERS), HIDDEN)
    bits = hs.view(torch.uint16).clone()
    bits[0, 0, 0] = 0x7FC1  # a NaN with a payload torch would never produce
    bits[0, 0, 1] = 0xFF81  # negative signalling-style NaN
    hs = bits.view(torch.bfloat16)
    write_store(tmp_path / "s.zarr", spec, small_cfg, [("x", torch.tensor([5, 6]), torch.tensor([0, 1]), hs)])
    got = open_dataset(tmp_path / "s.zarr")[0]["hidden_states"]
    assert torch.equal(got.view(torch.uint16), bits)


@settings(max_examples=25, deadline=None)
@given(arrays(np.uint16, st.tuples(st.integers(1, 40), st.just(len(LAYERS)), st.just(HIDDEN))))
def test_random_bits_round_trip(tmp_path_factory, hs):
    path = tmp_path_factory.mktemp("h") / "s.zarr"
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN)
    t = hs.shape[0]
    sample = ("h", np.zeros(t, np.int32), np.zeros(t, np.uint8), hs)
    write_store(path, spec, StoreConfig(chunk_tokens=8, shard_tokens=16), [sample])
    assert_matches(open_dataset(path), [sample])


def test_resume_continues_identically(tmp_path, spec, small_cfg):
    samples = [make_sample(i) for i in range(30)]
    write_store(tmp_path / "ref.zarr", spec, small_cfg, samples, commit_every=4)
    # Same samples over three openings of the writer, with appends after an opening's last commit dropped.
    with TaskStoreWriter.open(tmp_path / "b.zarr", spec, small_cfg) as w:
        for s in samples[:11]:
            w.append(*s)
        w.commit()
        w.append(*samples[11])  # never committed: must vanish on reopen
        assert w.num_committed == 11
    with TaskStoreWriter.open(tmp_path / "b.zarr", spec, small_cfg) as w:
        assert w.committed_sample_ids == {s[0] for s in samples[:11]}
        assert w.num_committed == 11
        for s in samples[11:20]:
            w.append(*s)
        w.commit()
    write_store(tmp_path / "b.zarr", spec, small_cfg, samples, commit_every=5)
    assert_matches(open_dataset(tmp_path / "b.zarr"), samples)
    ref, got = read_record(tmp_path / "ref.zarr"), read_record(tmp_path / "b.zarr")
    for k in ("sample_ids", "lengths", "num_tokens"):
        assert ref[k] == got[k]
    for name in ("hidden_states", "input_ids", "loss_mask"):
        a = zarr.open_array(tmp_path / "ref.zarr" / name, mode="r")[:]
        b = zarr.open_array(tmp_path / "b.zarr" / name, mode="r")[:]
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    # Compression is deterministic, so the shard files are byte-identical too.
    assert [s["crc32c"] for s in ref["shards"]["hidden_states"]] == [
        s["crc32c"] for s in got["shards"]["hidden_states"]
    ]


def test_failed_commit_keeps_previous_record(tmp_path, spec, small_cfg, monkeypatch):
    """A crash after the tail shard was rewritten but before the record: reopen restores the committed prefix."""
    samples = [make_sample(i) for i in range(8)]
    w = TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg)
    for s in samples[:3]:
        w.append(*s)
    w.commit()
    for s in samples[3:]:
        w.append(*s)
    monkeypatch.setattr(w._progress, "write", lambda *a, **k: (_ for _ in ()).throw(OSError("simulated crash")))
    with pytest.raises(OSError):
        w.commit()
    w.close()
    monkeypatch.undo()
    with TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg) as w:
        assert w.num_committed == 3
    assert_matches(open_dataset(tmp_path / "s.zarr"), samples[:3])
    write_store(tmp_path / "s.zarr", spec, small_cfg, samples)
    assert_matches(open_dataset(tmp_path / "s.zarr"), samples)


def test_zarr_shape_never_ahead_of_committed_data(tmp_path, spec, small_cfg):
    with TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg) as w:
        for i in range(20):
            w.append(*make_sample(i))  # full shards are written in the background, uncommitted
        meta = json.loads((tmp_path / "s.zarr" / "hidden_states" / "zarr.json").read_text())
        assert meta["shape"][0] == 0
        w.commit()
        meta = json.loads((tmp_path / "s.zarr" / "hidden_states" / "zarr.json").read_text())
        assert meta["shape"][0] == w.num_tokens == read_record(tmp_path / "s.zarr")["num_tokens"]


def test_second_writer_is_refused_with_holder(tmp_path, spec, small_cfg):
    w = TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg)
    try:
        with pytest.raises(StoreLockedError) as e:
            TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg)
        import os

        assert f"pid {os.getpid()}" in str(e.value) and "s.zarr" in str(e.value)
    finally:
        w.close()
    TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg).close()  # released on close


def test_lock_refuses_writer_in_another_process(tmp_path, spec, small_cfg):
    import subprocess
    import sys

    w = TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg)
    try:
        code = (
            "import sys; from eagle_batch.store import *; from eagle_batch.config import StoreConfig\n"
            "try:\n TaskStoreWriter.open(sys.argv[1], StoreSpec(layer_ids=[1,3,4], hidden_size=24, model_name='synthetic',"
            " model_revision='r1', config_hash='abc123'), StoreConfig(chunk_tokens=8, shard_tokens=32))\n"
            "except StoreLockedError as e:\n print(e); sys.exit(3)\n"
        )
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.zarr")], capture_output=True, text=True)
        assert r.returncode == 3, r.stderr
        assert "being written by another process" in r.stdout
    finally:
        w.close()


def test_spec_mismatch_is_refused(tmp_path, spec, small_cfg):
    write_store(tmp_path / "s.zarr", spec, small_cfg, [make_sample(0)], finalize=False)
    other = StoreSpec(
        layer_ids=[1, 3, 5], hidden_size=HIDDEN, model_name="synthetic", model_revision="r1", config_hash="abc123"
    )
    with pytest.raises(StoreMismatchError, match="layer_ids"):
        TaskStoreWriter.open(tmp_path / "s.zarr", other, small_cfg)


def test_bad_inputs_name_the_problem(tmp_path, spec, small_cfg):
    with TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg) as w:
        sid, ids, mask, hs = make_sample(0)
        with pytest.raises(ValueError, match="shapes disagree"):
            w.append(sid, ids, mask, hs[:, :2])
        with pytest.raises(TypeError, match="bfloat16"):
            w.append(sid, ids, mask, torch.zeros(len(ids), len(LAYERS), HIDDEN))
        w.append(sid, ids, mask, hs)
        with pytest.raises(ValueError, match="already in"):
            w.append(sid, ids, mask, hs)


def test_layer_selection_and_pickling(tmp_path, spec, small_cfg):
    samples = [make_sample(i) for i in range(6)]
    write_store(tmp_path / "s.zarr", spec, small_cfg, samples)
    ds = open_dataset(tmp_path / "s.zarr", layer_ids=[4, 1])
    got = ds[2]["hidden_states"].view(torch.uint16).numpy()
    np.testing.assert_array_equal(got, samples[2][3][:, [2, 0]])
    ds2 = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(ds2[2]["hidden_states"].view(torch.uint16).numpy(), got)
    assert ds.lengths().tolist() == [len(s[1]) for s in samples]


def test_dataloader_workers(tmp_path, spec, small_cfg):
    samples = [make_sample(i) for i in range(12)]
    write_store(tmp_path / "s.zarr", spec, small_cfg, samples)
    ds = open_dataset(tmp_path / "s.zarr")
    ds[0]  # opens files in the parent; workers must reopen their own
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, shuffle=False, multiprocessing_context="fork"
    )
    got = {x["sample_id"]: x["hidden_states"].view(torch.uint16).numpy() for x in loader}
    for sid, _, _, hs in samples:
        np.testing.assert_array_equal(got[sid], hs)


def test_reader_sees_only_committed_samples_of_live_store(tmp_path, spec, small_cfg):
    samples = [make_sample(i) for i in range(10)]
    with TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg) as w:
        for s in samples[:4]:
            w.append(*s)
        w.commit()
        for s in samples[4:]:
            w.append(*s)
        assert_matches(open_dataset(tmp_path / "s.zarr"), samples[:4])


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 45), min_size=1, max_size=12),
    commits=st.sets(st.integers(0, 11)),
    chunk=st.sampled_from([1, 3, 8]),
    chunks_per_shard=st.sampled_from([1, 2, 5]),
    reopen_at=st.integers(0, 12),
)
def test_any_lengths_commit_points_and_layouts(tmp_path_factory, lengths, commits, chunk, chunks_per_shard, reopen_at):
    """Samples crossing chunk and shard edges anywhere, commits anywhere, one reopen: plain zarr agrees."""
    path = tmp_path_factory.mktemp("p") / "s.zarr"
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN)
    cfg = StoreConfig(chunk_tokens=chunk, shard_tokens=chunk * chunks_per_shard, fsync=False)
    rng = np.random.default_rng(len(lengths))
    samples = [
        (
            f"s{i}",
            rng.integers(0, 9, t).astype(np.int32),
            rng.integers(0, 2, t).astype(np.uint8),
            rng.integers(0, 1 << 16, (t, len(LAYERS), HIDDEN)).astype(np.uint16),
        )
        for i, t in enumerate(lengths)
    ]
    w = TaskStoreWriter.open(path, spec, cfg)
    for i, s in enumerate(samples):
        if i == reopen_at:  # close (dropping uncommitted samples) and resume from the record
            w.commit()
            w.close()
            w = TaskStoreWriter.open(path, spec, cfg)
        w.append(*s)
        if i in commits:
            w.commit()
    w.finalize()
    w.close()
    assert_matches(open_dataset(path), samples)
    ref = np.concatenate([s[3] for s in samples])
    np.testing.assert_array_equal(zarr.open_array(path / "hidden_states", mode="r")[:].view(np.uint16), ref)
    np.testing.assert_array_equal(
        zarr.open_array(path / "offsets", mode="r")[:], np.concatenate([[0], np.cumsum(lengths)])
    )

"""store.adaptive: chunks that find no free compression slot are stored as raw blosc frames.

The result must be indistinguishable to every reader (eagle-batch's, plain zarr, verify), survive
resume across commits, and never recycle a raw chunk's buffer before its full shard is on disk."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zarr
from store_testlib import EveryOtherSlot, make_sample

from eagle_batch.config import StoreConfig
from eagle_batch.store import TaskStoreWriter, open_dataset, verify
from eagle_batch.store.ingest import Ingest
from eagle_batch.store.stream import Stream


def _write(path, spec, cfg, samples, slots, commit_every=3, reopen_after=None):
    w = TaskStoreWriter.open(path, spec, cfg)
    w._ingest._encode_slots = slots
    stats = {"compressed": 0, "stored_raw": 0}
    for i, (sid, ids, mask, hs) in enumerate(samples):
        w.append(sid, ids, mask, hs)
        if (i + 1) % commit_every == 0:
            w.commit()
        if reopen_after is not None and i + 1 == reopen_after:
            w.commit()
            for k, v in w.chunk_stats().items():
                stats[k] += v
            w.close()
            w = TaskStoreWriter.open(path, spec, cfg)
            w._ingest._encode_slots = slots
    w.finalize()
    for k, v in w.chunk_stats().items():
        stats[k] += v
    w.close()
    return stats


@pytest.mark.parametrize("busy_all", [True, False], ids=["all-raw", "mixed"])
def test_raw_chunks_read_back_bit_exact_everywhere(tmp_path, spec, busy_all, monkeypatch):
    monkeypatch.setattr(Ingest, "io_backlog", lambda self: 0)  # a disk that keeps up: raw allowed
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=True)
    samples = [make_sample(s) for s in range(40)]
    stats = _write(tmp_path / "a.zarr", spec, cfg, samples, EveryOtherSlot(busy_all), reopen_after=17)
    assert stats["stored_raw"] > 0
    assert (stats["compressed"] == 0) == busy_all
    ref = np.concatenate([s[3] for s in samples])
    # plain zarr, knowing nothing of eagle-batch, decodes the memcpyed frames with its blosc codec
    got = zarr.open_array(tmp_path / "a.zarr" / "hidden_states", mode="r")[:].view(np.uint16)
    np.testing.assert_array_equal(got, ref)
    ds = open_dataset(tmp_path / "a.zarr")
    for i in (0, 17, 39):
        np.testing.assert_array_equal(ds.get_arrays(i)["hidden_states"], samples[i][3])
    assert verify(tmp_path / "a.zarr", True) == []


def test_adaptive_off_or_other_codecs_always_compress(tmp_path, spec):
    samples = [make_sample(s) for s in range(12)]
    for name, cfg in {
        "off": StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=False),
        "zstd": StoreConfig(chunk_tokens=8, shard_tokens=32, codec="zstd", adaptive=True),
    }.items():
        stats = _write(tmp_path / f"{name}.zarr", spec, cfg, samples, threading.Semaphore(64))
        assert stats["stored_raw"] == 0 and stats["compressed"] > 0, name


def test_raw_store_same_bytes_as_stored_uncompressed(tmp_path, spec, monkeypatch):
    """Every raw frame is the 16-byte blosc header plus the chunk's bytes: size = raw size + 16 per chunk."""
    monkeypatch.setattr(Ingest, "io_backlog", lambda self: 0)  # a disk that keeps up: raw allowed
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=True)
    samples = [make_sample(s, max_len=9) for s in range(64)]
    _write(tmp_path / "r.zarr", spec, cfg, samples, EveryOtherSlot(True), commit_every=1000)
    tokens = sum(len(s[1]) for s in samples)
    full_chunks = tokens // 8
    row = samples[0][3][0].nbytes
    shards = sorted((tmp_path / "r.zarr" / "hidden_states" / "c").rglob("*"))
    payload = sum(f.stat().st_size for f in shards if f.is_file())
    index_bytes = sum(1 for f in shards if f.is_file()) * (4 * 16 + 4)
    # the zero-padded tail chunk is compressed by the commit; every full chunk is a raw frame
    assert payload - index_bytes >= full_chunks * (8 * row + 16)


def test_no_raw_chunks_while_the_disk_is_the_bottleneck(tmp_path, spec, monkeypatch):
    """With shard writes queued up, a raw chunk would only add bytes to the slowest stage: compress instead."""
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=True)
    samples = [make_sample(s) for s in range(12)]
    monkeypatch.setattr(Ingest, "io_backlog", lambda self: Ingest.IO_QUEUE_RAW_LIMIT)
    stats = _write(tmp_path / "busy-disk.zarr", spec, cfg, samples, EveryOtherSlot(busy_all=True))
    assert stats["stored_raw"] == 0 and stats["compressed"] > 0
    monkeypatch.setattr(Ingest, "io_backlog", lambda self: Ingest.IO_QUEUE_RAW_LIMIT - 1)
    stats = _write(tmp_path / "idle-disk.zarr", spec, cfg, samples, EveryOtherSlot(busy_all=True))
    assert stats["compressed"] == 0 and stats["stored_raw"] > 0


def test_disk_backlog_counts_only_shards_whose_chunks_are_encoded(tmp_path, spec, monkeypatch):
    """Shards waiting for compression are the compression's backlog: counting them as the disk's would turn
    raw chunks off exactly when compression is the bottleneck, and make append wait at the disk's queue.
    Shards stuck in the write are the disk's."""
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=True, fsync=False)
    encode_gate, disk_open = threading.Event(), threading.Event()
    disk_open.set()
    real_job, real_write = Stream.encode_job, Ingest._write_shard

    def slow_encode(self, chunks, loan):
        encode_gate.wait(30)
        return real_job(self, chunks, loan)

    def slow_disk(self, lay, *a, **k):
        if lay.name == "hidden_states":  # token-id and mask shards go through
            disk_open.wait(30)
        return real_write(self, lay, *a, **k)

    def eventually(pred):
        deadline = time.monotonic() + 30
        while not pred() and time.monotonic() < deadline:
            time.sleep(0.01)
        return pred()

    monkeypatch.setattr(Stream, "encode_job", slow_encode)
    monkeypatch.setattr(Ingest, "_write_shard", slow_disk)
    w = TaskStoreWriter.open(tmp_path / "s.zarr", spec, cfg)
    rng = np.random.default_rng(0)
    ids = [f"s{i}" for i in range(2 + Ingest.IO_QUEUE_LIMIT + 2)]

    def append(sid):  # one full 32-token shard of each array
        w.append(
            sid,
            np.arange(32, dtype=np.int32),
            np.ones(32, np.uint8),
            rng.integers(0, 1 << 16, (32, len(spec.layer_ids), spec.hidden_size), dtype=np.uint16),
        )

    try:
        for sid in ids[:2]:
            append(sid)
        # the token-id and mask shards are written, the hidden-state shards wait for compression ...
        assert eventually(lambda: sum(not f.done() for f in w._ingest._pending_io) == 2)
        time.sleep(0.05)
        assert w._ingest.io_backlog() == 0  # ... which is not the disk's backlog
        # More shards than the disk's queue limit while compression is stuck: append must not wait (chunks
        # that find no compression slot are kept raw and written).
        more = threading.Thread(target=lambda: [append(sid) for sid in ids[2:]], daemon=True)
        more.start()
        more.join(20)
        assert not more.is_alive(), "append waited for shards that only wait for compression"
        assert w.chunk_stats()["stored_raw"] > 0
        disk_open.clear()
        encode_gate.set()
        assert eventually(lambda: w._ingest.io_backlog() >= 2)  # every chunk encoded, the writes held by the disk
        disk_open.set()
        w.commit()
        assert w._ingest.io_backlog() == 0
    finally:
        encode_gate.set()
        disk_open.set()
        w.close()
    assert [s["sample_id"] for s in open_dataset(tmp_path / "s.zarr")] == ids

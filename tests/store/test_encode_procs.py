"""Encode processes (store/encode_procs.py): rows lent from shared memory are compressed by other processes.

The store they write must be byte-for-byte the store the thread path writes, every loan must come back
exactly once, and a dead encode process must fail the commit (never commit a shard it did not write).
"""

import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreError, StoreSpec, TaskStoreWriter, hidden_states_to_uint16, open_dataset, verify

SPEC = StoreSpec(layer_ids=[1, 2], hidden_size=64, model_name="t")
ROW = 2 * 64  # uint16 values per token


def _cfg(processes: int) -> StoreConfig:
    return StoreConfig(codec="blosc-zstd", chunk_tokens=16, shard_tokens=64, fsync=False, adaptive=False,
                       encode_processes=processes)


def _samples(n=14, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = int(rng.integers(5, 70))  # chunks inside one sample and chunks spanning two
        hs = (rng.normal(size=(t, 2, 64)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        out.append((f"s{i}", rng.integers(0, 1000, t), (rng.random(t) < 0.5).astype(np.uint8), hs))
    return out


class Ring:
    """A file-backed region like the capture's shared ring: rows are written into it, then lent."""

    def __init__(self, path, nbytes):
        self.path = str(path)
        with open(path, "wb") as f:
            f.truncate(nbytes)
        fd = os.open(path, os.O_RDWR)
        self.mm = mmap.mmap(fd, nbytes)
        os.close(fd)
        self.data = np.frombuffer(self.mm, np.uint8)
        self.pos = 0

    def put(self, hs):
        n = hs.nbytes
        view = self.data[self.pos:self.pos + n].view(np.uint16).reshape(hs.shape)
        view[:] = hs
        self.pos += -(-n // 512) * 512
        return view


def _write(path, samples, processes, ring=None, commit_at=6):
    released = []
    with TaskStoreWriter.open(path, SPEC, _cfg(processes)) as w:
        if ring is not None:
            assert w.share_memory(ring.path, ring.data)
        for i, (sid, ids, mask, hs) in enumerate(samples):
            lent = ring.put(hs) if ring is not None else hs.copy()
            w.append(sid, ids, mask, lent, on_release=lambda sid=sid: released.append(sid))
            if i == commit_at:
                w.commit()
        w.finalize()
        stats = w.chunk_stats()
    return released, stats


def test_processes_write_the_same_bytes_as_threads(tmp_path):
    samples = _samples()
    ring = Ring(tmp_path / "ring", 4 << 20)
    released, stats = _write(tmp_path / "procs.zarr", samples, 2, ring)
    assert sorted(released) == sorted(s[0] for s in samples)  # every loan back, exactly once
    assert stats["compressed_in_processes"] > 0
    _, thread_stats = _write(tmp_path / "threads.zarr", samples, 0)
    assert thread_stats["compressed_in_processes"] == 0
    shards = sorted(p.relative_to(tmp_path / "threads.zarr") for p in (tmp_path / "threads.zarr").rglob("*")
                    if p.is_file() and p.parent.name != "meta" and "c" in p.parts)
    assert shards
    for rel in shards:  # adaptive off: the same chunks, the same codec, the same bytes
        assert (tmp_path / "procs.zarr" / rel).read_bytes() == (tmp_path / "threads.zarr" / rel).read_bytes(), rel
    assert verify(tmp_path / "procs.zarr") == []
    ds = open_dataset(tmp_path / "procs.zarr")
    for i, (sid, ids, mask, hs) in enumerate(samples):
        got = ds[i]
        assert got["sample_id"] == sid
        np.testing.assert_array_equal(hidden_states_to_uint16(got["hidden_states"]), hs)


def test_share_memory_is_refused_with_processes_off(tmp_path):
    ring = Ring(tmp_path / "ring", 1 << 20)
    with TaskStoreWriter.open(tmp_path / "s.zarr", SPEC, _cfg(0)) as w:
        assert w.share_memory(ring.path, ring.data) is False
        assert w._procs is None


def test_killed_encode_process_fails_the_commit_and_reopen_keeps_the_committed(tmp_path):
    samples = _samples(20, seed=1)
    ring = Ring(tmp_path / "ring", 8 << 20)
    path = tmp_path / "s.zarr"
    w = TaskStoreWriter.open(path, SPEC, _cfg(1))
    released = []
    try:
        assert w.share_memory(ring.path, ring.data)
        for sid, ids, mask, hs in samples[:8]:
            w.append(sid, ids, mask, ring.put(hs), on_release=lambda sid=sid: released.append(sid))
        w.commit()
        committed = w.num_committed
        os.kill(w._procs._procs[0].pid, signal.SIGKILL)
        w._procs._procs[0].wait()
        with pytest.raises(Exception) as e:
            for sid, ids, mask, hs in samples[8:]:
                w.append(sid, ids, mask, ring.put(hs), on_release=lambda sid=sid: released.append(sid))
            w.commit()
        assert "encode process" in str(e.value) or isinstance(e.value, StoreError)
    finally:
        w.close()
    assert len(released) == len(set(released))  # no loan released twice
    w2 = TaskStoreWriter.open(path, SPEC, _cfg(0))
    try:
        assert w2.num_committed == committed
    finally:
        w2.close()
    assert verify(path) == []


def test_a_killed_writer_leaves_no_encode_process(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time, numpy as np
        sys.path.insert(0, {os.getcwd()!r})
        from tests.store.test_encode_procs import Ring, SPEC, _cfg
        from eagle_batch.store import TaskStoreWriter
        ring = Ring({str(tmp_path / 'ring')!r}, 1 << 20)
        w = TaskStoreWriter.open({str(tmp_path / 's.zarr')!r}, SPEC, _cfg(2))
        w.share_memory(ring.path, ring.data)
        print(" ".join(str(p.pid) for p in w._procs._procs), flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in p.stdout.readline().split()]
    assert len(pids) == 2
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 20
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [q for q in alive if _alive(q)]
    assert not alive, f"encode processes {alive} outlived their writer"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False

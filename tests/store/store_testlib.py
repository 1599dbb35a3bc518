"""Shared helpers for store tests: deterministic synthetic samples and a small layout (many shards, few bytes)."""

from __future__ import annotations

import threading

import numpy as np

from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec

LAYERS = [1, 3, 4]
HIDDEN = 24


def make_sample(seed: int, max_len: int = 70):
    """(sample_id, input_ids int32, loss_mask uint8, hidden_states uint16 bits [T, L, H]) from a seed."""
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, max_len))
    ids = rng.integers(0, 50000, t).astype(np.int32)
    mask = rng.integers(0, 2, t).astype(np.uint8)
    # Normal-ish bf16 values: the top 16 bits of float32 normals (plus an outlier channel, like real states).
    f = rng.standard_normal((t, len(LAYERS), HIDDEN)).astype(np.float32)
    f[:, :, 3] *= 300.0
    hs = (f.view(np.uint32) >> 16).astype(np.uint16)
    return f"sample-{seed:05d}", ids, mask, hs


class EveryOtherSlot:
    """A compression-slot semaphore that is 'busy' for every other non-blocking acquire."""

    def __init__(self, busy_all: bool):
        self.busy_all = busy_all
        self.calls = 0
        self.lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        with self.lock:
            self.calls += 1
            return blocking or (not self.busy_all and self.calls % 2 == 0)  # a wait (with a timeout too) gets one

    def release(self) -> None:
        pass


# --- writer subprocess and SIGKILL trials (used by test_kill.py and tests/stress/kill_writer.py) --------

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

KILL_SPEC = dict(layer_ids=LAYERS, hidden_size=HIDDEN, model_name="synthetic", config_hash="kill")
KILL_CFG = dict(chunk_tokens=8, shard_tokens=32)


def writer_main(path: str, n_samples: int, commit_every: int, adaptive: bool = False, dtype: str = "bfloat16") -> None:
    """The child: (re)open the store, append what is not committed, commit every few samples, finalize."""
    from eagle_batch.store import TaskStoreWriter

    spec = StoreSpec(**KILL_SPEC, dtype=dtype)
    with TaskStoreWriter.open(path, spec, StoreConfig(**KILL_CFG, adaptive=adaptive)) as w:
        print("ready", flush=True)
        for i in range(n_samples):
            s = make_sample(i)
            if s[0] in w.committed_sample_ids:
                continue
            # adaptive runs as the capture does: rows lent to the writer, compressed in place
            w.append(*s, on_release=(lambda: None) if adaptive else None)
            if (i + 1) % commit_every == 0:
                w.commit()
        w.finalize()
    print("done", flush=True)


def spawn_writer(
    path: Path, n_samples: int, commit_every: int, adaptive: bool = False, dtype: str = "bfloat16"
) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    args = [str(path), str(n_samples), str(commit_every), str(int(adaptive)), dtype]
    return subprocess.Popen(
        [sys.executable, __file__, "write", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_writer_to_end(
    path: Path, n_samples: int, commit_every: int, adaptive: bool = False, dtype: str = "bfloat16"
) -> float:
    """Run the child uninterrupted; return its seconds from 'ready' to exit."""
    p = spawn_writer(path, n_samples, commit_every, adaptive, dtype)
    assert p.stdout.readline().strip() == "ready", p.stderr.read()
    t0 = time.monotonic()
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and "done" in out, err
    return time.monotonic() - t0


def reference_arrays(n_samples: int, dtype: str = "bfloat16") -> dict:
    """What a store of the first `n_samples` samples holds: `arrays` (each token array's raw values, as plain
    zarr reads them) and `read` (hidden states as the reader returns them: bf16 bits)."""
    from eagle_batch.store.fp8 import dequantize, float8, quantize

    samples = [make_sample(i) for i in range(n_samples)]
    hs = np.concatenate([s[3] for s in samples])
    arrays = {"hidden_states": hs}
    if dtype != "bfloat16":
        q = quantize(hs, float8(dtype))
        arrays = {"hidden_states": q.codes, "hidden_states_scale": q.scales}
        hs = dequantize(q.codes, q.scales, float8(dtype))
    arrays.update(input_ids=np.concatenate([s[1] for s in samples]), loss_mask=np.concatenate([s[2] for s in samples]))
    return {
        "sample_ids": [s[0] for s in samples],
        "lengths": [len(s[1]) for s in samples],
        "arrays": arrays,
        "read": hs,
    }


def check_interrupted_store(path: Path, ref: dict) -> int:
    """What a reader may see after a kill: a committed prefix of the reference, nothing else. -> samples."""
    import zarr

    from eagle_batch.store import open_dataset, read_record

    if not (path / "progress.json").is_file():
        return 0  # killed while creating: nothing was committed
    r = read_record(path)
    n, t = r["num_samples"], r["num_tokens"]
    assert r["sample_ids"] == ref["sample_ids"][:n] and r["lengths"] == ref["lengths"][:n]
    ds = open_dataset(path)
    assert len(ds) == n
    for i in {0, n // 2, n - 1} if n else ():
        x = ds.get_arrays(i)
        a, b = sum(ref["lengths"][:i]), sum(ref["lengths"][: i + 1])
        np.testing.assert_array_equal(x["hidden_states"], ref["read"][a:b])
    # Plain zarr trusts shapes: they must never cover data that was not written (zeros).
    for name, want in ref["arrays"].items():
        arr = zarr.open_array(path / name, mode="r")
        assert arr.shape[0] <= t, f"{name} shape {arr.shape[0]} is ahead of the {t} committed tokens"
        np.testing.assert_array_equal(arr[:].view(want.dtype), want[: arr.shape[0]])
    return n


def check_final_store(path: Path, ref_store: Path, ref: dict, same_bytes: bool = True) -> None:
    import zarr

    from eagle_batch.store import read_record

    a, b = read_record(ref_store), read_record(path)
    for k in ("sample_ids", "lengths", "num_samples", "num_tokens"):
        assert a[k] == b[k], k
    for name, want in ref["arrays"].items():
        got = zarr.open_array(path / name, mode="r")[:]
        np.testing.assert_array_equal(got.view(want.dtype), want)
        if same_bytes:  # deterministic compression: same shard files (crc32c list) as the uninterrupted run
            assert [s["crc32c"] for s in a["shards"][name]] == [s["crc32c"] for s in b["shards"][name]], name
    np.testing.assert_array_equal(
        zarr.open_array(path / "offsets", mode="r")[:], np.concatenate([[0], np.cumsum(ref["lengths"])])
    )
    assert list(zarr.open_array(path / "sample_ids", mode="r")[:]) == ref["sample_ids"]
    assert (path / "complete").is_file() and not list(path.rglob("*.partial"))
    from eagle_batch.store import verify

    assert verify(path) == []


def kill_trials(
    workdir: Path,
    kills_per_store: int,
    stores: int,
    n_samples: int = 120,
    commit_every: int = 3,
    seed: int = 0,
    log=print,
    min_kills: int = 0,
    adaptive: bool = False,
    dtype: str = "bfloat16",
) -> dict:
    """SIGKILL writers at random moments, resume each time, compare with an uninterrupted run.

    Each store gets up to `kills_per_store` kills (fewer once it is complete); stores are added until
    both `stores` stores were done and `min_kills` kills landed. With `adaptive` (store.adaptive: which
    chunks stay raw depends on timing; the rows are lent to the writer as the capture lends them) the
    data must be identical, the shard bytes need not be. `dtype`: the stores' store.dtype."""
    rng = np.random.default_rng(seed)
    ref = reference_arrays(n_samples, dtype)
    ref_store = workdir / "reference.zarr"
    write_s = run_writer_to_end(ref_store, n_samples, commit_every, adaptive, dtype)
    log(f"reference run: {write_s:.2f} s of writing after start-up")
    kills = 0
    committed_at_kill: list[int] = []
    s = 0
    while s < stores or kills < min_kills:
        path = workdir / f"store-{s}.zarr"
        committed = 0
        here = []
        for _ in range(kills_per_store):
            # Aim inside the work that is left, so later kills still land before the end.
            left_s = write_s * (n_samples - committed) / n_samples
            p = spawn_writer(path, n_samples, commit_every, adaptive, dtype)
            if rng.random() < 0.15:  # sometimes kill during start-up / recovery, before 'ready'
                time.sleep(rng.uniform(0.0, 1.0))
            else:
                line = p.stdout.readline().strip()
                assert line == "ready" or p.poll() is not None, (line, p.stderr.read())
                time.sleep(rng.uniform(0.0, left_s))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.communicate()
            assert p.returncode in (0, -signal.SIGKILL), p.stderr.read() if p.stderr else p.returncode
            committed = check_interrupted_store(path, ref)
            if p.returncode == -signal.SIGKILL:
                kills += 1
                here.append(committed)
            if (path / "complete").is_file():
                break  # nothing left to interrupt in this store
        committed_at_kill += here
        run_writer_to_end(path, n_samples, commit_every, adaptive, dtype)
        check_final_store(path, ref_store, ref, same_bytes=not adaptive)
        log(f"store {s}: committed samples at each kill {here}; final store identical to the reference")
        shutil.rmtree(path)
        s += 1
    return {"kills": kills, "stores": s, "committed_at_kill": committed_at_kill, "write_s": write_s}


if __name__ == "__main__":
    if sys.argv[1] == "write":
        writer_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), bool(int(sys.argv[5])), sys.argv[6])

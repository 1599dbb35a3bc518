"""Host probe for the store's write path: codec speed per core and with threads / processes, memcpy and
crc32c rates, the whole TaskStoreWriter with and without fsync, and the disk's fdatasync rate.

    PYTHONPATH=. OUT=/tmp/probe python3 lab/host_probe.py [POOL.npz]

POOL.npz: the real SmolLM2 state pool of `eagle-batch bench store` (default: computed or read from its
cache; copy the cached file to a machine without the model). Rows are cut to width 2048, the 1B Llama
of `bench capture`. PROBE_SCALE=0.02 makes a seconds-long smoke run; PROBE_DIR is where stores and the
dd file go. Writes $OUT/probe.json (benchmarks/capture-h200/host-probe.json came from this script).
"""

import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np

OUT = os.environ.get("OUT", "/tmp")
S = float(os.environ.get("PROBE_SCALE", "1"))
res = {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}
try:
    res["cpu"] = [l for l in open("/proc/cpuinfo") if l.startswith("model name")][0].split(":")[1].strip()
except Exception:
    pass
if len(sys.argv) > 1:
    pool = np.load(sys.argv[1])["rows"]
else:
    from eagle_batch.bench.store import real_state_pool

    pool = real_state_pool(256)[0]
H = 2048
rows = np.ascontiguousarray(pool[:, :, :H])  # [256, 4, 2048]
rng = np.random.default_rng(0)
chunks = [np.ascontiguousarray(rows[rng.permutation(256)[:64]]) for _ in range(32)]  # 1 MiB each


class _EntropyFrames:
    """store.entropy_only's encoder (eagle-batch's blosc frames, zstd entropy coding only) with numcodecs' API."""

    def __init__(self):
        from eagle_batch.store.blosc_frame import BloscFrameWriter

        self.w = BloscFrameWriter(1 << 20, 2)
        self.out = threading.local()

    def encode(self, chunk):
        out = getattr(self.out, "buf", None)
        if out is None:
            out = self.out.buf = np.empty(chunk.nbytes + 16, np.uint8)
        return memoryview(out)[: self.w.encode(chunk, out)]


def codec(name):
    from numcodecs import Blosc

    if name == "entropy-frames":
        return _EntropyFrames()
    cn, lvl = name.split("-")
    return Blosc(cn, int(lvl), Blosc.SHUFFLE, blocksize=1 << 20)


_codecs = {}


def enc_many(name, n):
    c = _codecs.get(name) or _codecs.setdefault(name, codec(name))
    t = 0  # one per process, shared by threads
    for i in range(n):
        t += len(c.encode(chunks[i % 32]))
    return t


def thread_rate(name, threads, total_mb):
    n = int(total_mb)
    per = [n // threads] * threads
    enc_many(name, 2)  # warm: the codec object, its buffers, the frame writer's reference headers
    with ThreadPoolExecutor(threads) as ex:
        t0 = time.perf_counter()
        out = sum(ex.map(lambda k: enc_many(name, k), per))
        dt = time.perf_counter() - t0
    raw = sum(per) * chunks[0].nbytes
    return {"codec": name, "threads": threads, "gb_s": round(raw / dt / 1e9, 3), "ratio": round(raw / out, 4)}


def _proc_init(arr):
    global chunks
    chunks = arr


def proc_rate(name, procs, total_mb):
    n = int(total_mb)
    per = [n // procs] * procs
    ctx = mp.get_context("fork")
    with ProcessPoolExecutor(procs, mp_context=ctx) as ex:
        list(ex.map(enc_many, [name] * procs, [1] * procs))  # warm
        t0 = time.perf_counter()
        sum(ex.map(enc_many, [name] * procs, per))
        dt = time.perf_counter() - t0
    raw = sum(per) * chunks[0].nbytes
    return {"codec": name, "procs": procs, "gb_s": round(raw / dt / 1e9, 3)}


enc = []
for name in ("zstd-1", "entropy-frames", "lz4-1", "blosclz-5", "lz4hc-1"):
    try:
        enc.append(thread_rate(name, 1, 400 * S))
    except Exception as e:
        enc.append({"codec": name, "error": repr(e)})
for t in (4, 8, 12, 16):
    enc.append(thread_rate("zstd-1", t, 3000 * S))
    enc.append(thread_rate("entropy-frames", t, 3000 * S))
enc.append(thread_rate("lz4-1", 8, 3000 * S))
for p in (8, 14):
    enc.append(proc_rate("zstd-1", p, 3000 * S))
res["encode"] = enc
print(json.dumps(enc), flush=True)

# memcpy / crc
import crc32c  # noqa: E402  (a probe: imports where each part starts)

big = np.concatenate(chunks)  # 32 MiB
dst = np.empty_like(big)
t0 = time.perf_counter()
for _ in range(30):
    np.copyto(dst, big)
res["memcpy_gb_s"] = round(30 * big.nbytes / (time.perf_counter() - t0) / 1e9, 2)
t0 = time.perf_counter()
for _ in range(30):
    crc32c.crc32c(big)
res["crc32c_gb_s"] = round(30 * big.nbytes / (time.perf_counter() - t0) / 1e9, 2)

# TaskStoreWriter end to end (2 GiB raw of [512, 4, 2048] samples)
from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec, TaskStoreWriter

spec = StoreSpec(layer_ids=[2, 8, 13, 16], hidden_size=H, model_name="probe")
T = 512
nsamp = max(8, int(256 * S))
ids = np.zeros(T, np.int32)
mask = np.ones(T, np.uint8)
samples = [np.ascontiguousarray(rows[rng.integers(0, 256, T)]) for _ in range(8)]
store_runs = []
base = os.environ.get("PROBE_DIR", "/root/probe")
os.makedirs(base, exist_ok=True)
for threads, fsync, codec_name, entropy in (
    (8, True, "blosc-zstd", True),
    (16, True, "blosc-zstd", True),
    (16, False, "blosc-zstd", True),
    (16, False, "blosc-zstd", False),
    (8, False, "blosc-zstd", True),
    (8, False, "blosc-zstd", False),
    (16, False, "none", False),
):
    d = tempfile.mkdtemp(dir=base)
    cfg = StoreConfig(fsync=fsync, codec=codec_name, entropy_only=entropy, adaptive=False)
    t0 = time.perf_counter()
    c0 = time.process_time()
    with TaskStoreWriter.open(os.path.join(d, "s.zarr"), spec, cfg, threads=threads) as w:
        for i in range(nsamp):
            w.append(f"s{i}", ids, mask, samples[i % 8])
        w.commit()
    dt = time.perf_counter() - t0
    raw = nsamp * samples[0].nbytes
    store_runs.append(
        {
            "threads": threads,
            "fsync": fsync,
            "codec": codec_name,
            "entropy_only": entropy,
            "gb_s": round(raw / dt / 1e9, 3),
            "cpu_s": round(time.process_time() - c0, 2),
            "wall_s": round(dt, 2),
        }
    )
    print(store_runs[-1], flush=True)
    subprocess.run(["rm", "-rf", d])
res["store"] = store_runs
# disk
f = os.path.join(base, "dd.bin")
r = subprocess.run(
    ["dd", "if=/dev/zero", f"of={f}", "bs=16M", f"count={max(1, int(256 * S))}", "conv=fdatasync"],
    capture_output=True,
    text=True,
)
res["dd_4g_fdatasync"] = r.stderr.strip().splitlines()[-1]
os.unlink(f)
res["df"] = subprocess.run(["df", "-h", base, "/dev/shm"], capture_output=True, text=True).stdout
print(json.dumps(res, indent=1))
json.dump(res, open(os.path.join(OUT, "probe.json"), "w"), indent=1)

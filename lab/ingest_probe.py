"""Ingest probe: how fast can the capture's writer path (WriterThread -> TaskStoreWriter) take states, with
no engine? Finds the store-side ceiling of `bench capture` on a host, stage by stage.

    PYTHONPATH=. OUT=/tmp/probe python3 lab/ingest_probe.py POOL.npz [DIR ...]

A producer thread hands [512, 4, 2048] bf16 samples (real SmolLM2 rows from the `bench store` pool, cut to
width 2048; see host_probe.py) to a WriterThread as fast as it takes them, like the shm receiver does;
the clock stops when the final commit returned. Each DIR (default: PROBE_DIR or /root/probe, and
/dev/shm) is run with fsync on and off, for each IO-thread count in PROBE_IO (default "4,8,16").
Reported per run: GB/s of raw states, the writer thread's busy fraction, the seconds the producer
waited on back-pressure, and append()'s stalls on shard IO and compression slots; plus the page-cache
write rate of `dd` without sync and the kernel's dirty-page limits. PROBE_GB (default 8) sets the
volume, PROBE_CHUNK store.chunk_tokens (default 0: the store's choice), PROBE_SWITCH the GIL switch
interval. Writes $OUT/ingest.json.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np
import torch

OUT = os.environ.get("OUT", "/tmp")
GB = float(os.environ.get("PROBE_GB", "8"))
IO = [int(x) for x in os.environ.get("PROBE_IO", "4,8,16").split(",")]
CHUNK = int(os.environ.get("PROBE_CHUNK", "0"))  # store.chunk_tokens (0: the store's ~4 MiB default)
if os.environ.get("PROBE_SWITCH"):  # the interpreter's GIL switch interval, seconds (default 0.005)
    sys.setswitchinterval(float(os.environ["PROBE_SWITCH"]))
pool = np.load(sys.argv[1])["rows"][:, :, :2048]
dirs = sys.argv[2:] or [os.environ.get("PROBE_DIR", "/root/probe"), "/dev/shm"]
T, L, H = 512, 4, 2048
rng = np.random.default_rng(0)
samples = [
    torch.from_numpy(np.ascontiguousarray(pool[rng.integers(0, len(pool), T)])).view(torch.bfloat16) for _ in range(16)
]
n = max(16, int(GB * 1e9 / samples[0].numel() / 2))
res = {"nproc": os.cpu_count(), "samples": n, "gb": round(n * samples[0].numel() * 2 / 1e9, 2), "runs": []}


def sh(cmd):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return r.stdout + r.stderr


res["dirty"] = sh("grep -H . /proc/sys/vm/dirty_*")
res["cgroup_memory_max"] = sh(
    "cat /sys/fs/cgroup/memory.max 2>/dev/null; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null"
)
res["mem"] = sh("free -g")

from eagle_batch.capture.sink import CapturedRequest
from eagle_batch.capture.writer import WriterThread
from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec, TaskStoreWriter

spec = StoreSpec(layer_ids=[2, 8, 13, 16], hidden_size=H, model_name="probe")
ids = np.zeros(T, np.int64)
ok = torch.tensor([True])


def one(base, fsync, io):
    d = tempfile.mkdtemp(dir=base)
    cfg = StoreConfig(fsync=fsync, chunk_tokens=CHUNK, io_threads=io)
    w = TaskStoreWriter.open(os.path.join(d, "s.zarr"), spec, cfg)
    wt = WriterThread(w, L, H)
    smp = [SimpleNamespace(sample_id=f"s{i}", input_ids=ids, loss_mask=np.ones(T, np.uint8)) for i in range(n)]
    wt.expect(smp)
    t0 = time.perf_counter()
    for i in range(n):
        wt.put(CapturedRequest(f"s{i}", f"r{i}", ids, samples[i % 16], finite=ok))  # GPU path: flag from the device
    t_put = time.perf_counter() - t0
    wt.commit(wait=True)
    dt = time.perf_counter() - t0
    wt.close()
    r = dict(
        dir=base,
        fsync=fsync,
        io_threads=io,
        chunk_tokens=w.layouts["hidden_states"].chunk_tokens,
        switch_s=sys.getswitchinterval(),
        encode_threads=w.encode_threads,
        gb_s=round(res["gb"] / dt, 3),
        wall_s=round(dt, 2),
        put_done_s=round(t_put, 2),
        writer_busy_frac=round(wt.stats.write_s / dt, 3),
        put_wait_s=round(wt.stats.put_wait_s, 2),
        commit_s=round(wt.stats.commit_s, 2),
        stall_s={k: round(v, 2) for k, v in w.stall_s.items()},
        chunks=w.chunk_stats(),
    )
    w.close()
    subprocess.run(["rm", "-rf", d])
    print(json.dumps(r), flush=True)
    return r


for base in dirs:
    os.makedirs(base, exist_ok=True)
    for fsync in (True, False):
        for io in IO:
            if base.startswith("/dev/shm") and fsync:
                continue  # fsync on tmpfs is a no-op
            res["runs"].append(one(base, fsync, io))
    f = os.path.join(base, "dd.bin")
    res.setdefault("dd_page_cache", {})[base] = sh(f"dd if=/dev/zero of={f} bs=16M count={int(GB * 64)} 2>&1 | tail -1")
    os.unlink(f)
print(json.dumps(res, indent=1))
json.dump(res, open(os.path.join(OUT, "ingest.json"), "w"), indent=1)

"""CPU seconds per GB of the capture's writer path (WriterThread -> TaskStoreWriter) on this machine, per codec,
no fsync, store in /dev/shm, adaptive off, producer as fast as the writer takes it.

    PYTHONPATH=. GB=2 python scripts/store_cpu_probe.py POOL.npz none,blosc-zstd

POOL.npz: `bench store`'s SmolLM2 row pool (rows [N, 4, 7168] uint16), cut to width 2048 as in
scripts/gpu/ingest_probe.py. Prints one JSON line per codec: GB/s, process CPU seconds per GB (user, sys).
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

from eagle_batch.capture.sink import CapturedRequest
from eagle_batch.capture.writer import WriterThread
from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec, TaskStoreWriter

T, L, H = 512, 4, 2048
pool = np.load(sys.argv[1])["rows"][:, :, :H]
rng = np.random.default_rng(0)
samples = [torch.from_numpy(np.ascontiguousarray(pool[rng.integers(0, len(pool), T)])).view(torch.bfloat16)
           for _ in range(16)]
n = int(float(os.environ.get("GB", "2")) * 1e9 / samples[0].numel() / 2)
spec = StoreSpec(layer_ids=[2, 8, 13, 16], hidden_size=H, model_name="probe")
ids = np.zeros(T, np.int64)
ok = torch.tensor([True])
for codec in sys.argv[2].split(","):
    d = tempfile.mkdtemp(dir="/dev/shm")
    w = TaskStoreWriter.open(os.path.join(d, "s.zarr"), spec, StoreConfig(fsync=False, codec=codec, adaptive=False))
    wt = WriterThread(w, L, H)
    wt.expect([SimpleNamespace(sample_id=f"s{i}", input_ids=ids, loss_mask=np.ones(T, np.uint8)) for i in range(n)])
    c0, t0 = os.times(), time.perf_counter()
    for i in range(n):
        wt.put(CapturedRequest(f"s{i}", f"r{i}", ids, samples[i % 16], finite=ok))
    wt.commit(wait=True)
    dt, c1 = time.perf_counter() - t0, os.times()
    gb = n * samples[0].numel() * 2 / 1e9
    user, sys_s = c1.user - c0.user, c1.system - c0.system
    print(json.dumps(dict(codec=codec, gb=round(gb, 2), gb_s=round(gb / dt, 2), cpu_s_per_gb=round((user + sys_s) / gb, 3),
                          user_s=round(user, 2), sys_s=round(sys_s, 2))), flush=True)
    wt.close()
    w.close()
    subprocess.run(["rm", "-rf", d])

"""CPU seconds per GB of the capture's writer path (WriterThread -> TaskStoreWriter) on this machine, per codec,
no fsync, store in /dev/shm, adaptive off, producer as fast as the writer takes it.

    PYTHONPATH=. GB=2 python lab/store_cpu_probe.py POOL.npz none,blosc-zstd
    PYTHONPATH=. GB=2 SPREAD=0.5 MODES=single,blocks python lab/store_cpu_probe.py POOL.npz blosc-zstd
    PYTHONPATH=. GB=2 ENTROPY=1,0,1,0 MODES=blocks python lab/store_cpu_probe.py POOL.npz blosc-zstd

POOL.npz: `bench store`'s SmolLM2 row pool (rows [N, 4, 7168] uint16), cut to width 2048 as in
lab/ingest_probe.py. Samples are 512 tokens, or with SPREAD=s drawn from 512 x [1 - s, 1 + s]. They
arrive as the shared-memory receiver hands them over: records of 16 samples back to back; MODES picks how
the writer thread sees them: `single` (each sample handed to the store alone) and/or `blocks` (with their
record, so a record's queued samples go to the store as one block: the shared-memory path). Prints one JSON line per codec and
mode: GB/s, process CPU seconds per GB (user, sys). ENTROPY: store.entropy_only per run (default 1; "1,0,1,0"
alternates eagle-batch's entropy-only frames and c-blosc's zstd, side by side).
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

T, L, H, PER_RECORD = 512, 4, 2048, 16
SPREAD = float(os.environ.get("SPREAD", "0"))
pool = np.load(sys.argv[1])["rows"][:, :, :H]
rng = np.random.default_rng(0)
records = []  # (record rows as uint16 [sum T, L, H], [(row0, T)])
for _ in range(4):
    lens = (
        [T] * PER_RECORD
        if SPREAD == 0
        else [int(x) for x in rng.integers(round(T * (1 - SPREAD)), round(T * (1 + SPREAD)) + 1, PER_RECORD)]
    )
    rows = np.ascontiguousarray(pool[rng.integers(0, len(pool), sum(lens))])
    records.append((rows, [(int(sum(lens[:j])), n) for j, n in enumerate(lens)]))
per_cycle = sum(r[0].nbytes for r in records)
cycles = max(1, round(float(os.environ.get("GB", "2")) * 1e9 / per_cycle))
spec = StoreSpec(layer_ids=[2, 8, 13, 16], hidden_size=H, model_name="probe")
ok = torch.tensor([True])


def requests(mode):
    """(sample id, T, CapturedRequest) in arrival order."""
    i = 0
    for _ in range(cycles):
        for rows, parts in records:
            for row0, n in parts:
                bits = rows[row0 : row0 + n]
                states = torch.from_numpy(bits).view(torch.bfloat16)
                yield (
                    f"s{i}",
                    n,
                    CapturedRequest(
                        f"s{i}",
                        f"r{i}",
                        None,
                        states,
                        finite=ok,
                        bits=bits,
                        block=rows if mode == "blocks" else None,
                        row0=row0,
                    ),
                )
                i += 1


runs = [
    (codec, mode, entropy == "1")
    for entropy in os.environ.get("ENTROPY", "1").split(",")
    for codec in sys.argv[2].split(",")
    for mode in os.environ.get("MODES", "single").split(",")
]
for codec, mode, entropy in runs:
    d = tempfile.mkdtemp(dir="/dev/shm")
    w = TaskStoreWriter.open(
        os.path.join(d, "s.zarr"), spec, StoreConfig(fsync=False, codec=codec, adaptive=False, entropy_only=entropy)
    )
    wt = WriterThread(w, L, H)
    todo = list(requests(mode))
    wt.expect(
        [
            SimpleNamespace(sample_id=sid, input_ids=np.zeros(n, np.int64), loss_mask=np.ones(n, np.uint8))
            for sid, n, _ in todo
        ]
    )
    c0, t0 = os.times(), time.perf_counter()
    for _, _, req in todo:
        wt.put(req)
    wt.commit(wait=True)
    dt, c1 = time.perf_counter() - t0, os.times()
    gb = cycles * per_cycle / 1e9
    user, sys_s = c1.user - c0.user, c1.system - c0.system
    print(
        json.dumps(
            dict(
                codec=codec,
                mode=mode,
                entropy_only=w.encoder_info()["entropy_only"],
                spread=SPREAD,
                gb=round(gb, 2),
                gb_s=round(gb / dt, 2),
                cpu_s_per_gb=round((user + sys_s) / gb, 3),
                user_s=round(user, 2),
                sys_s=round(sys_s, 2),
                writer_busy_s=round(wt.stats.write_s, 3),
            )
        ),
        flush=True,
    )
    wt.close()
    w.close()
    subprocess.run(["rm", "-rf", d])

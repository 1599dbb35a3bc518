"""EpochLoader: one set of DataLoader workers serves every epoch, in the plan's exact batch order.

Runs in a fresh interpreter: forked DataLoader workers must not inherit threads of engines that
earlier tests started in this process (see test_cli_export.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

CHILD = r"""
import os
import numpy as np
from conftest import TINY, TINY_LAYERS
from helpers import random_samples
from eagle_batch.train.data import BatchPlan, EpochLoader, InMemoryDataset, TrainSamples

ts = TrainSamples(InMemoryDataset(random_samples(40, TINY_LAYERS, TINY["hidden"], TINY["vocab"]), TINY_LAYERS),
                  TINY_LAYERS[:3], TINY_LAYERS[3])
plan = BatchPlan(ts.lengths(), 256, seed=5, world_size=2)
for rank in (0, 1):
    loader = EpochLoader(ts, plan, rank, num_workers=2, prefetch_factor=2)
    pids = set()
    for epoch, skip, stop in ((0, 0, None), (1, 0, 2), (2, 3, None), (3, 0, None)):
        want = plan.rank_batches(epoch, rank)[skip:]
        got = []
        it = loader.epoch(epoch, skip)
        assert len(it) == len(want), (epoch, len(it), len(want))
        for b in it:
            got.append(sorted(b["index"].tolist()))
            if stop is not None and len(got) == stop:
                break  # a run that stops mid-epoch (checkpoint, requeue) and goes on with the next position
        n = len(got)
        assert got == [sorted(x) for x in want[:n]], (rank, epoch)
        assert n == (stop or len(want))
        pids |= {w.pid for w in loader.loader._iterator._workers}
    assert len(pids) == 2, pids  # the same two workers served all four epochs
print("ok")
"""


def test_epoch_loader_keeps_workers_and_plan_order():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=HERE, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr

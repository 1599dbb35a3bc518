"""EpochLoader.stream: one DataLoader runs across epoch boundaries, in the plan's exact batch order.

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
    el = EpochLoader(ts, plan, rank, num_workers=2, prefetch_factor=2)
    for start_epoch, skip in ((0, 0), (1, 3), (2, len(plan.rank_batches(2, rank)))):  # the last: a finished epoch
        want = []
        e, k = start_epoch, skip
        while len(want) < 12:
            b = plan.rank_batches(e, rank)
            want += [(e, i, sorted(b[i])) for i in range(k, len(b))]
            e, k = e + 1, 0
        want = want[:12]
        got = []
        stream = el.stream(start_epoch, skip)
        for epoch, i, batch in stream:
            got.append((epoch, i, sorted(batch["index"].tolist())))
            if len(got) == 12:
                break  # a run that stops (checkpoint, requeue); the workers must stop with it
        stream.close()
        assert got == want, (rank, start_epoch, skip)
        assert len({g[0] for g in got}) >= 2  # it did cross an epoch boundary
print("ok")
"""


def test_stream_crosses_epochs_in_plan_order():
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])
    )
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=HERE, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr

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


# Every data worker aborts as it exits (a native library's abort in the worker's exit, which an H200 training
# met after its last step): the stream still closes, with one warning, and the batches taken are whole.
ABORTS_AT_EXIT = r"""
import multiprocessing.util
import os
import torch
from conftest import TINY, TINY_LAYERS
from helpers import random_samples
from eagle_batch.train.data import BatchPlan, EpochLoader, InMemoryDataset, TrainSamples

class AbortsAtExit(TrainSamples):
    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None and not getattr(self, "armed", False):
            multiprocessing.util.Finalize(None, os.abort, exitpriority=100)  # runs as the worker process exits
            self.armed = True
        return super().__getitem__(i)

ts = AbortsAtExit(InMemoryDataset(random_samples(40, TINY_LAYERS, TINY["hidden"], TINY["vocab"]), TINY_LAYERS),
                  TINY_LAYERS[:3], TINY_LAYERS[3])
plan = BatchPlan(ts.lengths(), 256, seed=5)
stream = EpochLoader(ts, plan, 0, num_workers=2, prefetch_factor=2).stream()
got = [next(stream) for _ in range(4)]
stream.close()
want = [sorted(b) for b in plan.rank_batches(0, 0)[:4]]
assert [sorted(batch["index"].tolist()) for _, _, batch in got] == want
print("ok")
"""


def _run_child(code: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=HERE, timeout=300)


def test_stream_crosses_epochs_in_plan_order():
    r = _run_child(CHILD)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_a_worker_that_aborts_as_it_stops_is_a_warning_not_a_failure():
    r = _run_child(ABORTS_AT_EXIT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    warned = [x for x in r.stderr.splitlines() if x.startswith("[eagle-batch train] warning:")]
    assert len(warned) == 1 and "is killed by signal" in warned[0] and "nothing is lost" in warned[0], r.stderr
    assert "Traceback" not in r.stderr, r.stderr

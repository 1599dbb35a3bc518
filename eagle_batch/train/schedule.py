"""The learning-rate schedule and the wall-clock budget that can set its length."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from .distributed import all_reduce_sum


class LRSchedule:
    """Linear warmup then cosine to `min_ratio` at step `total`. A callable object, not a closure, so that
    LambdaLR's state_dict carries `total` (set from the measured speed under train.time_budget_s)."""

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if self.warmup > 0 and step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class TimeBudget:
    """train.time_budget_s: fit the run into a wall-clock budget, counted from its first step.

    After `skip` steps (compilation, warm-up) it times the next `measure` steps, the device synchronized
    at both ends, and sets the schedule's total so the remaining steps fill the budget at that speed: the
    cosine then reaches its floor at the budget's end, and the draft is exported as usual. A run still going
    at 1.05x the budget (a slower stretch) ends there, exported. Rank 0 measures; every rank takes its
    numbers (one broadcast at the measurement and a flag on log steps)."""

    def __init__(self, budget_s: float, skip: int = 5, measure: int = 20):
        self.budget_s, self.skip, self.measure = budget_s, skip, measure
        self.t0 = self.t_a = 0.0
        self.done = budget_s <= 0

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def _now(self, device: torch.device) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def new_total(self, r: Any, steps_this_run: int) -> int | None:
        """After each step: the total to set (once), else None."""
        if self.done:
            return None
        if steps_this_run == self.skip:
            self.t_a = self._now(r.device)
        if steps_this_run < self.skip + self.measure:
            return None
        self.done = True
        now = self._now(r.device)
        rate = self.measure / max(now - self.t_a, 1e-9)
        total = r.step + max(1, int((self.budget_s - (now - self.t0)) * rate))
        if r.world > 1:
            t = torch.tensor([total], device=r.device)
            torch.distributed.broadcast(t, 0)
            total = int(t.item())
        return total

    def over(self, r: Any, log_now: bool) -> bool:
        """Past 1.05x the budget (single rank: checked every step; DDP: on log steps, agreed on)."""
        return self.budget_s > 0 and past(self.t0, 1.05 * self.budget_s, r, log_now)


class TimeLimit:
    """train.max_time_s: end the run (exported, like a finished one) once this many seconds have passed since
    its first step, whatever steps remain; unlike TimeBudget the schedule is not refitted, so a run that
    finishes its steps in time is unaffected. For a caller with a hard deadline (a shared device's slot, the
    evaluation that must follow); a Slurm time limit is what checkpoint / requeue is for instead."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def reached(self, r: Any, log_now: bool) -> bool:
        return self.limit_s > 0 and past(self.t0, self.limit_s, r, log_now)


def past(t0: float, seconds: float, r: Any, log_now: bool) -> bool:
    """More than `seconds` since t0 (single rank: checked every step; DDP: on log steps only, agreed on by
    every rank, so that all of them stop at the same step)."""
    if r.world > 1 and not log_now:
        return False
    late = time.perf_counter() - t0 > seconds
    if r.world > 1:
        late = bool(all_reduce_sum(torch.tensor([float(late)], device=r.device)).item() > 0)
    return late

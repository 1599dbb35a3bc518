"""What one task of a run's array does: a work function, chosen by the run's `extract.work`.

    capture     prepared samples -> vLLM capture -> the task's hidden-state store (`eagle-batch extract`)
    regenerate  source conversations -> the target's own answers -> output shards (`eagle-batch regenerate`)
    synthetic   the plan's tasks -> pseudo hidden states -> task stores, no model: tests a cluster's wiring
    M:F         a function `F` of module `M` with the same signature (a work of your own; tests use it to
                inject faults into the real launch machinery)

A work function gets a `TaskContext` and returns True when its task is complete. The contract:

- It is the single writer of its task's output and takes an exclusive lock on it first (a duplicate job
  raises the store's `StoreLockedError` before writing anything; `ArrayTask` reports it as a duplicate).
- It commits what it finished in durable, all-or-nothing units and calls `ctx.report(samples, tokens)`
  after each commit (and once when it opened its output, with what earlier attempts committed), so
  `status` shows committed progress, never work in flight. `ctx.set_totals` gives the task's size.
- It polls `ctx.should_stop()` at safe points; when true it commits and returns False.
- A resumed attempt skips what is committed: it never recomputes or rewrites it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from eagle_batch.config import RunConfig


@dataclass
class TaskContext:
    """What a work function gets from its array task."""

    cfg: RunConfig
    run_dir: Path
    task_id: int
    should_stop: Callable[[], bool]
    report: Callable[[int, int], None]  # (samples committed, tokens committed), after every commit
    set_totals: Callable[[int, int], None]  # (samples, tokens) of the whole task
    # `resume --repair` asked for it: open the output with repair=True (truncate to the last unit before the
    # first damaged one; the work then recomputes from there).
    repair: bool = False


class TaskWork(Protocol):
    def __call__(self, ctx: TaskContext) -> bool: ...


# Built-in works, by name -> "module:function" (imported only when a task runs one).
WORKS = {
    "capture": "eagle_batch.launch.capture_work:capture_work",
    "regenerate": "eagle_batch.regenerate.generate:regenerate_work",
    "synthetic": "eagle_batch.launch.synthetic_work:synthetic_work",
}


class UnknownWorkError(ValueError):
    """extract.work names no built-in work and no importable module:function."""


def work_spec(name: str) -> str:
    """The module:function a work name stands for."""
    spec = WORKS.get(name, name)
    if ":" not in spec:
        raise UnknownWorkError(
            f"extract.work={name!r} is neither a built-in work ({', '.join(WORKS)}) nor 'module:function'."
        )
    return spec


def resolve_work(name: str) -> TaskWork:
    mod, _, fn = work_spec(name).partition(":")
    try:
        found: Any = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise UnknownWorkError(f"extract.work={name!r}: cannot load {mod}:{fn} ({e}).") from None
    return found

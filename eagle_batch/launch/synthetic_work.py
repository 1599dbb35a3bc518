"""The `synthetic` work (`extract.work=synthetic`): test a cluster's wiring without a model.

Each task writes deterministic pseudo hidden states for its samples through the real `TaskStoreWriter`
(lock, commit record per sample, finalize), with the same state file, progress reports, checkpoint signal,
requeue and resume as `capture`; only the model is missing. Use it to check a cluster set-up (partition,
accounts, container binds, array limits, preemption) at no GPU cost before a real extraction, or to measure
what the Slurm side costs at scale (`eagle-batch bench slurm-run`).

- Samples per task: the task's entry in RUN/prepared/plan.json (`num_samples`, else the length of `rows`),
  so a plan written by `prepare` or by hand (`{"num_tasks": N, "tasks": [{"task_id": t, "rows": [...]}]}`)
  both work. Sample i of task t is named `t{t}-s{i}`, unique across the run.
- States: 2 layers of width 16 (bf16 bit patterns, finite), 8-31 tokens a sample; the store's chunking is
  the run's `store` section.
- `extract.synthetic_sample_s` seconds of sleep after each commit (no CPU) stand for the model's time, so
  a task lasts long enough to be signalled, killed or preempted mid-way.
"""

from __future__ import annotations

import json
import time

import numpy as np

from eagle_batch.errors import UserError

from .state import store_path
from .work import TaskContext

LAYER_IDS = [1, 2]
HIDDEN_SIZE = 16


def synthetic_sample(task_id: int, i: int) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(sample_id, input_ids, loss_mask, hidden-state bf16 bits [tokens, layers, hidden]) of sample i of a task."""
    rng = np.random.default_rng(1_000_003 * task_id + i)
    n = 8 + (7 * i + task_id) % 24
    ids = rng.integers(0, 1000, n, dtype=np.int32)
    mask = (np.arange(n) % 3 != 0).astype(np.uint8)
    # Positive finite bf16 bit patterns (exponent < 0xFF): readers and verify reject NaN/Inf.
    hs = rng.integers(0, 0x7F00, (n, len(LAYER_IDS), HIDDEN_SIZE), dtype=np.uint16)
    return f"t{task_id}-s{i}", ids, mask, hs


def planned_samples(run_dir, task_id: int) -> int:
    """Samples of task `task_id` in RUN/prepared/plan.json."""
    path = run_dir / "prepared" / "plan.json"
    try:
        plan = json.loads(path.read_text())
        entry = next(t for t in plan["tasks"] if int(t["task_id"]) == task_id)
        return int(entry.get("num_samples", len(entry.get("rows", []))))
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
        raise UserError(
            f"{path}: no plan entry for task {task_id} ({type(e).__name__}: {e}); run `eagle-batch prepare` "
            "or write a plan with one entry per task."
        ) from None


def synthetic_work(ctx: TaskContext) -> bool:
    """Write the task's synthetic samples, one commit each; True once all are committed and the store finalized."""
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    count = planned_samples(ctx.run_dir, ctx.task_id)
    samples = [synthetic_sample(ctx.task_id, i) for i in range(count)]
    ctx.set_totals(count, sum(len(s[1]) for s in samples))
    spec = StoreSpec(layer_ids=LAYER_IDS, hidden_size=HIDDEN_SIZE, model_name="synthetic")
    writer = TaskStoreWriter.open(
        store_path(ctx.run_dir, ctx.task_id), spec, ctx.cfg.store, repair=ctx.repair, on_commit=ctx.report
    )
    try:
        if writer.is_complete:
            return True
        done = set(writer.committed_sample_ids)
        for sample_id, ids, mask, hs in samples:
            if sample_id in done:  # committed by an earlier attempt: never rewritten
                continue
            if ctx.should_stop():
                return False
            writer.append(sample_id, ids, mask, hs)
            writer.commit()
            time.sleep(ctx.cfg.extract.synthetic_sample_s)
        writer.finalize()
        return True
    finally:
        writer.close()

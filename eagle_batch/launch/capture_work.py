"""The `capture` work of an array task: the task's prepared samples -> vLLM capture -> its task store.

This is where the stages meet: `data.PreparedDataset` gives the samples, `store.TaskStoreWriter` is the
task's single writer (its lock refuses a duplicate job; opening it recovers to the last commit), and
`capture.run_capture` appends what is not committed yet. Progress is what the store committed: the writer
calls `ctx.report` once the lock is held and after every commit, whichever way capture appends.
"""

from __future__ import annotations

from eagle_batch.capture import run_capture
from eagle_batch.data import PreparedDataset
from eagle_batch.store import TaskStoreWriter

from .state import store_path
from .store_match import store_spec
from .work import TaskContext


def capture_work(ctx: TaskContext) -> bool:
    """Capture the task's samples into its store; True when every sample is committed and it is finalized."""
    samples = PreparedDataset(ctx.run_dir).task_samples(ctx.task_id)
    ctx.set_totals(len(samples), int(sum(len(s.input_ids) for s in samples)))
    writer = TaskStoreWriter.open(
        store_path(ctx.run_dir, ctx.task_id),
        store_spec(ctx.cfg),
        ctx.cfg.store,
        repair=ctx.repair,
        on_commit=ctx.report,
    )
    try:
        if writer.is_complete:
            return True
        run_capture(ctx.cfg, samples, writer, should_stop=ctx.should_stop)
        if set(writer.committed_sample_ids) >= {s.sample_id for s in samples}:
            writer.finalize()
            return True
        return False
    finally:
        writer.close()

"""Slurm orchestration: extraction arrays through submitit, per-task state, status, resume, cancel, chaining.

    from eagle_batch.launch import ExtractTask, submit_tasks, submit_after, run_status

See docs/slurm.md for how tasks checkpoint, requeue and resume, and what `status` shows.
"""

from .state import TaskState, read_state, read_submissions, state_path, store_path
from .status import run_status, task_rows, totals
from .submit import (
    SubmitError,
    afterok_dependency,
    live_tasks,
    make_executor,
    pending_arrays,
    plan_num_tasks,
    submit_after,
    submit_tasks,
)
from .task import DuplicateTaskError, ExtractTask, TaskContext, capture_work

__all__ = [
    "DuplicateTaskError",
    "ExtractTask",
    "SubmitError",
    "afterok_dependency",
    "pending_arrays",
    "TaskContext",
    "TaskState",
    "capture_work",
    "live_tasks",
    "make_executor",
    "plan_num_tasks",
    "read_state",
    "read_submissions",
    "run_status",
    "state_path",
    "store_path",
    "submit_after",
    "submit_tasks",
    "task_rows",
    "totals",
]

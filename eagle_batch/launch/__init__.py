"""Every job eagle-batch runs, on Slurm (submitit) or this machine: run arrays, training, chained jobs.

    from eagle_batch.launch import ArrayTask, submit_tasks, submit_after, run_status

- `job`: what every job does around its work (the checkpoint signal as a flag, requeue, host requeue).
- `task.ArrayTask`: one task of a run's array; it runs the run's work (`work`: capture, regenerate, ...).
- `train_job`: training as a Slurm array (`TrainTask`); `local_train.run_local`: here, restarted after a crash.
- `submit`: executors (Slurm through submitit; `local` for one machine), arrays, `afterok` chaining.
- `state`, `status`: what each task recorded, reconciled with Slurm or the local executor.
- `cli_*`: the extract, status, resume, cancel and train commands.

See docs/how-to/slurm-cluster.md for how tasks checkpoint, requeue and resume, and what `status` shows.
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
from .task import ArrayTask, DuplicateTaskError
from .work import WORKS, TaskContext, TaskWork

__all__ = [
    "WORKS",
    "ArrayTask",
    "DuplicateTaskError",
    "SubmitError",
    "TaskContext",
    "TaskState",
    "TaskWork",
    "afterok_dependency",
    "live_tasks",
    "make_executor",
    "pending_arrays",
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

"""Training as a Slurm job: `TrainTask` (one array task per sweep entry); on this machine: `launch.local_train`.

`eagle_batch.train` is the library (`train(cfg, should_stop)` trains or resumes one draft and exports it);
this module decides where it runs:

- Slurm: `submit_training(cfgs, after=RUN)` submits one array of `TrainTask`s, each with
  `slurm.gpus_per_node` ranks per node (`ntasks_per_node` = GPUs; submitit exports the torch.distributed
  environment) on `slurm.nodes` nodes. With `after`, the array depends (`afterok`) on RUN's unfinished
  extraction arrays and its first rank 0 to start aggregates the stores.
- Here: `launch.local_train.run_local(cfg, nproc)`: the ranks as child processes of this machine meeting
  through a file rendezvous (gloo on the CPU, NCCL on GPUs), restarted after a crash.

Checkpoint/requeue as every eagle-batch job (`launch.job`): SIGUSR2 sets a flag, the trainer checkpoints
after the current step and returns "stopped", and submitit requeues the task, which resumes from
RUN/train/<name>/checkpoints/latest.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

import submitit

from eagle_batch import environment
from eagle_batch.config import RunConfig

from . import state as S
from .job import StopSignal
from .submit import afterok_dependency, make_executor


def _aggregate_once(run_dir: Path) -> None:
    """Aggregate the run's stores unless dataset.json exists; a file lock serializes sweep tasks."""
    if (run_dir / "dataset.json").is_file():
        return
    lock = run_dir / "train" / ".aggregate.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if not (run_dir / "dataset.json").is_file():
            from eagle_batch.store import aggregate

            aggregate(run_dir)


class TrainTask(submitit.helpers.Checkpointable):
    """One sweep entry as a Slurm (array) task; every rank of the task runs this."""

    def __init__(self, cfg: RunConfig, aggregate: bool = False):
        self.cfg = cfg
        self.aggregate = aggregate

    def __repr__(self) -> str:
        return f"TrainTask({self.cfg.run_dir!r}, name={self.cfg.train.name!r})"

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        # Everything is on disk (checkpoints/latest); a fresh task resumes from it.
        return submitit.helpers.DelayedSubmission(TrainTask(self.cfg, self.aggregate))

    def __call__(self) -> dict:
        from eagle_batch.train.trainer import init_distributed, shutdown_distributed, train

        try:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        except RuntimeError:  # not inside a submitit job: a single process
            pass
        ranks = environment.dist_ranks()
        if self.aggregate and ranks.rank == 0:
            _aggregate_once(Path(self.cfg.run_dir))
        with StopSignal(f"training {self.cfg.train.name}") as stop:
            try:
                if self.aggregate and ranks.world_size > 1:
                    import torch.distributed as dist

                    init_distributed()
                    dist.barrier()  # the other ranks wait for rank 0's aggregate
                result = train(self.cfg, should_stop=stop)
            finally:
                shutdown_distributed()
        if result["status"] == "stopped":
            stop.hand_back()  # submitit: pickle checkpoint() and requeue
        return result


def submit_training(cfgs: list[RunConfig], after: str | os.PathLike = "") -> tuple[S.Submission, list[str]]:
    """Submit one Slurm array of TrainTask (one per config), recorded in RUN/slurm/submissions.jsonl;
    returns the submission and each task's job id."""
    cfg0 = cfgs[0]
    run_dir = Path(after or cfg0.run_dir)
    dependency = afterok_dependency(run_dir) if after else ""
    ranks = max(1, int(cfg0.slurm.gpus_per_node))  # one rank per GPU
    ex = make_executor(cfg0, run_dir, kind="train", dependency=dependency, executor="slurm", tasks_per_node=ranks)
    with ex.batch():
        jobs = [ex.submit(TrainTask(c, aggregate=bool(after))) for c in cfgs]
    ids = [str(j.job_id) for j in jobs]
    sub = S.Submission(
        job_id=ids[0].split("_")[0],
        executor="slurm",
        tasks=[],
        time=time.time(),
        kind="train",
        folder=str(run_dir / S.SLURM_DIR),
        dependency=dependency,
    )
    S.append_submission(run_dir, sub)
    return sub, ids

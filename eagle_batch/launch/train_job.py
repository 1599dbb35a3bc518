"""Training as a Slurm job: `TrainTask` (one array task per sweep entry); on this machine: `launch.local_train`.

`eagle_batch.train` is the library (`train(cfg, should_stop)` trains or resumes one draft and exports it);
this module decides where it runs:

- Slurm: `submit_training(cfgs, after=RUN)` submits one array of `TrainTask`s, one per sweep entry, with one
  rank per GPU (`slurm.gpus_per_node`, at least one). On one node (`slurm.nodes=1`) the task is a single
  Slurm process that runs its ranks as children through `launch.local_train.run_local`, which starts them
  again from the last checkpoint after a crash (a CUDA abort, a dead data worker), as `train --local` does;
  it asks for the CPUs of one task per rank (`slurm.cpus_per_task` x ranks). On several nodes srun starts
  every rank (`ntasks_per_node` = GPUs; submitit exports the torch.distributed environment) and a crash
  fails the array task; submitting the training again resumes it. With `after`, the array depends
  (`afterok`) on RUN's unfinished extraction arrays and its first rank 0 to start aggregates the stores.
- Here: `launch.local_train.run_local(cfg, nproc)`: the ranks as child processes of this machine meeting
  through a file rendezvous (gloo on the CPU, NCCL on GPUs), restarted after a crash.

Checkpoint/requeue as every eagle-batch job (`launch.job`): SIGUSR2 sets a flag (which `run_local` passes on
to its child ranks), the trainer checkpoints after the current step and returns "stopped", and submitit
requeues the task, which resumes from RUN/train/<name>/checkpoints/latest.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import submitit

from eagle_batch import environment
from eagle_batch.config import RunConfig

from . import state as S
from .job import StopSignal
from .submit import afterok_dependency, first_start_dependency, make_executor


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
    """One sweep entry as a Slurm (array) task.

    `child_ranks` > 0: this process is the task's only one and runs that many ranks as its children
    (`run_local`, restarted after a crash); 0: srun started every rank, each running this."""

    def __init__(self, cfg: RunConfig, aggregate: bool = False, child_ranks: int = 0):
        self.cfg = cfg
        self.aggregate = aggregate
        self.child_ranks = child_ranks

    def __repr__(self) -> str:
        return f"TrainTask({self.cfg.run_dir!r}, name={self.cfg.train.name!r})"

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        # Everything is on disk (checkpoints/latest); a fresh task resumes from it.
        return submitit.helpers.DelayedSubmission(TrainTask(self.cfg, self.aggregate, self.child_ranks))

    def __call__(self) -> dict:
        train_here = self._child_ranks_training() if self.child_ranks > 0 else self._srun_rank_training()
        with StopSignal(f"training {self.cfg.train.name}") as stop:
            result = train_here(stop)
        if result["status"] == "stopped":
            stop.hand_back()  # submitit: pickle checkpoint() and requeue
        return result

    def _child_ranks_training(self) -> Callable[[StopSignal], dict]:
        """Aggregate if asked; -> the training of this task's ranks as children of this process."""
        from .local_train import run_local

        if self.aggregate:
            _aggregate_once(Path(self.cfg.run_dir))
        return lambda stop: run_local(self.cfg, self.child_ranks, should_stop=stop)

    def _srun_rank_training(self) -> Callable[[StopSignal], dict]:
        """Join srun's ranks (rank 0 aggregates if asked); -> this rank's training."""
        from eagle_batch.train.trainer import init_distributed, shutdown_distributed, train

        try:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        except RuntimeError:  # not inside a submitit job: a single process
            pass
        ranks = environment.dist_ranks()
        if self.aggregate and ranks.rank == 0:
            _aggregate_once(Path(self.cfg.run_dir))

        def train_rank(stop: StopSignal) -> dict:
            try:
                if self.aggregate and ranks.world_size > 1:
                    import torch.distributed as dist

                    init_distributed()
                    dist.barrier()  # the other ranks wait for rank 0's aggregate
                return train(self.cfg, should_stop=stop)
            finally:
                shutdown_distributed()

        return train_rank


def training_executor(
    cfg: RunConfig, run_dir: Path, dependency: str = "", check_fits: bool = True
) -> tuple[submitit.SlurmExecutor, int]:
    """The executor of a training array, and the ranks each of its tasks runs as children (0: srun starts
    every rank, on several nodes). One rank per GPU; the fit check sees one task per rank, and on one node
    the same CPUs go to the one task."""
    ranks = max(1, int(cfg.slurm.gpus_per_node))
    ex = make_executor(
        cfg, run_dir, kind="train", dependency=dependency, executor="slurm", tasks_per_node=ranks, check_fits=check_fits
    )
    child_ranks = ranks if int(cfg.slurm.nodes) == 1 else 0
    if child_ranks:
        ex.update_parameters(ntasks_per_node=1, cpus_per_task=int(cfg.slurm.cpus_per_task) * ranks)
    return ex, child_ranks


def submit_training(cfgs: list[RunConfig], after: str | os.PathLike = "") -> tuple[S.Submission, list[str]]:
    """Submit one Slurm array of TrainTask (one per config), recorded in RUN/slurm/submissions.jsonl;
    returns the submission and each task's job id."""
    cfg0 = cfgs[0]
    run_dir = Path(after or cfg0.run_dir)
    # Pipelined (train.follow): start once the extraction does and read its stores as they grow (no aggregate);
    # otherwise once every extraction task has succeeded, aggregating first.
    follow = bool(cfg0.train.follow)
    dependency = "" if not after else first_start_dependency(run_dir) if follow else afterok_dependency(run_dir)
    ex, child_ranks = training_executor(cfg0, run_dir, dependency)
    with ex.batch():
        jobs = [ex.submit(TrainTask(c, aggregate=bool(after) and not follow, child_ranks=child_ranks)) for c in cfgs]
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

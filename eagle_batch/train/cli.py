"""`eagle-batch train CONFIG [key=value ...]`: train EAGLE-3 drafts, locally or as a Slurm array.

- One task per entry of `train.sweep` (a list of override dicts; none = one task). Each task writes to
  RUN/train/<train.name> (sweep tasks get `<name>-<i>` unless the entry sets train.name).
- `--local`: run the tasks one after another here; `--nproc N` runs each with N DDP ranks
  (torch.multiprocessing, gloo on CPU / nccl on GPU).
- Slurm (default when sbatch exists, `slurm.executor`): one array (`TrainTask` per sweep entry), each
  task with `slurm.gpus_per_node` ranks on its node (`ntasks_per_node` = GPUs; submitit exports the
  torch.distributed env), `slurm.nodes` nodes. `--after RUN` adds `afterok` on the run's unfinished
  extraction arrays (eagle_batch.launch), and the first task to start aggregates the stores.
- Checkpoint/requeue: SIGUSR2 (time limit / preemption) sets a flag; the trainer checkpoints after the
  current step and submitit requeues the task, which resumes from RUN/train/<name>/checkpoints/latest.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import submitit

from eagle_batch.cli_common import add_config_arguments, config_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--local", action="store_true", help="run here instead of submitting to Slurm")
    p.add_argument("--nproc", type=int, default=1, help="--local: DDP ranks per task (default 1)")
    p.add_argument(
        "--after",
        metavar="RUN",
        default="",
        help="Slurm: start after RUN's extraction arrays succeed (afterok); aggregates first",
    )
    p.add_argument("--dry-run", action="store_true", help="print the task configurations and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or lines (= train.progress=false)")


def _flatten(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _flatten(v, key + ".")
        else:
            out.append(f"{key}={json.dumps(v) if isinstance(v, (list, bool)) or v is None else v}")
    return out


def task_configs(args: argparse.Namespace) -> list[Any]:
    """One resolved RunConfig per sweep entry (the sweep itself is cleared in each)."""
    from eagle_batch.config import load_config

    base = config_from_args(args)
    sweep = list(base.train.sweep or [])
    if not sweep:
        cfg = copy.deepcopy(base)
        return [cfg]
    out = []
    for i, entry in enumerate(sweep):
        ov = _flatten(dict(entry))
        if not any(o.startswith("train.name=") for o in ov):
            ov.append(f"train.name={base.train.name}-{i}")
        cfg = load_config(args.config, list(args.overrides) + ov + ["train.sweep=[]"])
        out.append(cfg)
    return out


# ----------------------------------------------------------------------------------------------------


def _aggregate_once(run_dir: Path) -> None:
    """Aggregate the run's stores unless dataset.json exists; a file lock serializes sweep tasks."""
    import fcntl

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

    def __init__(self, cfg: Any, aggregate: bool = False):
        self.cfg = cfg
        self.aggregate = aggregate

    def __repr__(self) -> str:
        return f"TrainTask({self.cfg.run_dir!r}, name={self.cfg.train.name!r})"

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        # Everything is on disk (checkpoints/latest); a fresh task resumes from it.
        return submitit.helpers.DelayedSubmission(TrainTask(self.cfg, self.aggregate))

    def __call__(self) -> dict:
        from .trainer import shutdown_distributed, train

        try:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        except RuntimeError:  # not inside a submitit job (local executor): single process
            pass
        if self.aggregate and int(os.environ.get("RANK", 0)) == 0:
            _aggregate_once(Path(self.cfg.run_dir))
        stop = {"flag": False}
        original = signal.getsignal(signal.SIGUSR2)

        def on_usr2(signum, frame):  # a flag only: the trainer checkpoints after the current step
            print("[eagle-batch train] SIGUSR2: checkpointing and requeueing", file=sys.stderr, flush=True)
            stop["flag"] = True

        signal.signal(signal.SIGUSR2, on_usr2)
        if self.aggregate and int(os.environ.get("WORLD_SIZE", 1)) > 1:
            import torch.distributed as dist

            from .trainer import init_distributed

            init_distributed()
            dist.barrier()  # the other ranks wait for rank 0's aggregate
        try:
            result = train(self.cfg, should_stop=lambda: stop["flag"])
        finally:
            shutdown_distributed()
        if result["status"] == "stopped":
            signal.signal(signal.SIGUSR2, original)
            if callable(original):
                original(signal.SIGUSR2, None)  # submitit: pickle checkpoint() and requeue
        return result


def _spawn_rank(rank: int, world: int, cfg: Any, rendezvous: str) -> None:
    import faulthandler

    faulthandler.enable()  # a C++ abort in a rank (gloo, OpenMP) then prints each Python thread's stack
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), EAGLE_BATCH_DIST_INIT=f"file://{rendezvous}"
    )
    from .trainer import shutdown_distributed, train

    try:
        train(cfg)
    finally:
        shutdown_distributed()


def run_local(cfg: Any, nproc: int = 1) -> dict:
    from .trainer import output_dir, train

    if nproc <= 1:
        return train(cfg)
    import shutil
    import tempfile

    import torch.multiprocessing as mp

    # The ranks meet through a file, not a TCP port: a port picked free here and bound later by rank 0 can
    # be taken in between by any other process on the machine (Slurm jobs, vLLM engines in the same test
    # run), and a rank that reaches a stranger's listener fails in native code.
    folder = tempfile.mkdtemp(prefix="eagle-batch-rendezvous-")
    try:
        mp.spawn(_spawn_rank, args=(nproc, cfg, os.path.join(folder, "store")), nprocs=nproc, join=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    p = output_dir(cfg) / "result.json"
    return json.loads(p.read_text()) if p.is_file() else {"status": "unknown", "out_dir": str(output_dir(cfg))}


def submit(cfgs: list[Any], after: str = "") -> list[str]:
    """Submit one array of TrainTask (one per cfg). Returns the job ids."""
    from eagle_batch.launch import state as S
    from eagle_batch.launch.submit import _pending_arrays, make_executor

    cfg0 = cfgs[0]
    run_dir = Path(after or cfg0.run_dir)
    dependency = ""
    if after:
        deps = sorted(set(_pending_arrays(run_dir)))
        dependency = "afterok:" + ":".join(deps) if deps else ""
    ex = make_executor(cfg0, run_dir, kind="train", dependency=dependency, executor="slurm")
    ranks = max(1, int(cfg0.slurm.gpus_per_node))
    ex.update_parameters(ntasks_per_node=ranks)  # one process (DDP rank) per GPU
    with ex.batch():
        jobs = [ex.submit(TrainTask(c, aggregate=bool(after))) for c in cfgs]
    ids = [str(j.job_id) for j in jobs]
    import time

    S.append_submission(
        run_dir,
        S.Submission(
            job_id=ids[0].split("_")[0],
            executor="slurm",
            tasks=[],
            time=time.time(),
            kind="train",
            folder=str(run_dir / S.SLURM_DIR),
            dependency=dependency,
        ),
    )
    return ids


def run(args: argparse.Namespace) -> int:
    args.overrides = list(args.overrides) + (["train.progress=false"] if args.no_progress else [])
    cfgs = task_configs(args)
    if args.dry_run:
        for c in cfgs:
            print(
                json.dumps(
                    {
                        "name": c.train.name,
                        "run_dir": c.run_dir,
                        "lr": c.train.lr,
                        "ttt_steps": c.train.ttt_steps,
                        "steps": c.train.steps,
                    }
                )
            )
        return 0
    executor = cfgs[0].slurm.executor
    import shutil

    use_slurm = not args.local and (executor == "slurm" or (executor == "auto" and shutil.which("sbatch")))
    if args.after and not use_slurm:
        print(
            "eagle-batch train: --after needs Slurm (sbatch on PATH, slurm.executor=slurm/auto); "
            "without it, run training after extraction finishes.",
            file=sys.stderr,
        )
        return 2
    if use_slurm:
        ids = submit(cfgs, after=args.after)
        print(
            f"submitted {len(ids)} training task(s): {', '.join(ids)}"
            f"{' (after ' + args.after + ')' if args.after else ''}"
        )
        return 0
    rc = 0
    for c in cfgs:
        r = run_local(c, args.nproc)
        print(json.dumps(r))
        rc = rc or (0 if r.get("status") == "done" else 1)
    return rc

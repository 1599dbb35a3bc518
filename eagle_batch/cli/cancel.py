"""`eagle-batch cancel RUN [--task N ...]`: cancel a run's queued and running jobs (Slurm jobs, or the local
executor's tasks and the processes they started)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from itertools import groupby


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run directory")
    p.add_argument(
        "--task",
        type=int,
        action="append",
        default=[],
        help="cancel only this task (repeatable); default: every job of the run, training included",
    )


def run(args: argparse.Namespace) -> int:
    from eagle_batch.launch.local_cancel import stop_local
    from eagle_batch.launch.slurm_query import is_live, job_states
    from eagle_batch.launch.state import read_submissions

    subs = read_submissions(args.run_dir)
    if not subs:
        print(
            f"eagle-batch cancel: {args.run_dir} has no submissions (RUN/slurm/submissions.jsonl); nothing to cancel.",
            file=sys.stderr,
        )
        return 1
    known = {t for s in subs for t in s.tasks}
    unknown = sorted(set(args.task) - known)
    if unknown:
        print(
            f"eagle-batch cancel: --task {', '.join(map(str, unknown))}: no such task in {args.run_dir}'s "
            f"submissions (tasks {_ranges(sorted(known))}); see `eagle-batch status {args.run_dir}`.",
            file=sys.stderr,
        )
        return 2
    states = job_states(s.job_id for s in subs if s.executor == "slurm")
    targets: list[str] = []
    local_stopped = 0
    for s in subs:
        if s.executor == "local":
            if args.task:
                print(
                    f"eagle-batch cancel: --task applies to Slurm arrays; local job {s.job_id} runs its tasks "
                    "one after another and is cancelled as a whole.",
                    file=sys.stderr,
                )
            elif (stop := stop_local(args.run_dir, s)) is not None:
                local_stopped += 1
                print(_local_stopped(args.run_dir, stop))
            continue
        if args.task:
            targets += [
                s.task_job_id(t) for t in s.tasks if t in args.task and is_live(states.get(s.task_job_id(t), ""))
            ]
        elif any(is_live(v) for k, v in states.items() if k == s.job_id or k.startswith(s.job_id + "_")):
            targets.append(s.job_id)
    if not targets:
        if not local_stopped:
            slurm = any(s.executor == "slurm" for s in subs)
            print(f"nothing of {args.run_dir} is queued or running{' (no live Slurm job)' if slurm else ''}.")
        return 0
    r = subprocess.run(["scancel", *targets], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"eagle-batch cancel: scancel {' '.join(targets)} failed: {r.stderr.strip()}", file=sys.stderr)
        return 1
    print(f"cancelled {', '.join(targets)}; committed data stays; `eagle-batch resume {args.run_dir}` continues.")
    return 0


def _local_stopped(run_dir: str, stop) -> str:
    """What `cancel` did to a local job (launch.local_cancel.LocalStop), in one line."""
    ran = f"{len(stop.stopped)} running task(s) stopped ({_ranges(stop.stopped)}) with the processes they started"
    queued = f"; {len(stop.not_started)} not started will not start" if stop.not_started else ""
    left = f"; still alive: task(s) {_ranges(stop.left_running)}" if stop.left_running else ""
    return (
        f"cancelled local job {stop.job_id}: {ran}{queued}{left}; committed data stays; "
        f"`eagle-batch resume {run_dir}` continues."
    )


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] (sorted) -> "0-2, 5, 7-8": ids of one run share id minus position."""
    runs = [[i for _, i in group] for _, group in groupby(enumerate(ids), key=lambda p: p[1] - p[0])]
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "none"

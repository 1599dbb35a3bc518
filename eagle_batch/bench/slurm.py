"""`eagle-batch bench slurm [--json]`: submit-to-done wall time of a trivial Slurm array through submitit.

Measures what eagle-batch adds on top of the real work: sbatch through submitit, scheduling, job start,
the Python/submitit start-up of each task, result pickling, and seeing the array finish. Each task runs
`_trivial` (returns its index), with the same executor construction (`launch.submit.make_executor`) that
extraction uses.

Output (one JSON object): tasks, submit_s (the sbatch call), wall_s (submit to every result observed),
per_task_s (wall_s / tasks: the amortised cost of one array task), task_start_latency_s (mean/max, submit to
each task's start, from sacct), task_elapsed_s (mean, each task's own run time from sacct), node (CPUs /
GPUs Slurm advertises), machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from datetime import datetime

from eagle_batch import environment
from eagle_batch.cli.common import float_at_least, int_at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", type=int_at_least(1), default=16, help="array size (default 16)")
    p.add_argument("--cpus", type=int_at_least(1), default=1, help="cpus per task")
    p.add_argument("--gpus", type=int_at_least(0), default=0, help="GPUs per task (gpus_per_node)")
    p.add_argument("--parallelism", type=int_at_least(1), default=16, help="slurm array parallelism")
    p.add_argument("--folder", default="", help="submitit folder (default: a temporary directory)")
    p.add_argument("--timeout", type=float_at_least(1.0), default=600, help="give up after this many seconds")


def _trivial(i: int) -> int:
    return i


def _sacct_times(array_id: str) -> list[tuple[float, float, float]]:
    """[(start, end, elapsed_s)] per array task from sacct (1 s resolution)."""
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", array_id, "-o", "JobID,Start,End,ElapsedRaw"], capture_output=True, text=True
    ).stdout
    rows = []
    for line in out.splitlines():
        jid, start, end, el = (line.split("|") + ["", "", "", ""])[:4]
        try:
            rows.append((datetime.fromisoformat(start).timestamp(), datetime.fromisoformat(end).timestamp(), float(el)))
        except ValueError:
            continue
    return rows


def run(args: argparse.Namespace) -> int:
    if shutil.which("sbatch") is None:
        print(json.dumps({"error": "no Slurm here (sbatch not on PATH); start one with .ci/slurm-up.sh"}))
        return 1
    from eagle_batch.config import RunConfig, SlurmConfig
    from eagle_batch.launch.submit import make_executor

    tmp = None
    folder = args.folder
    if not folder:
        tmp = tempfile.TemporaryDirectory(prefix="eb-bench-slurm-", dir=environment.bench_dir())
        folder = tmp.name
    cfg = RunConfig(run_dir=folder)
    cfg.slurm = SlurmConfig(
        executor="slurm",
        gpus_per_node=args.gpus,
        cpus_per_task=args.cpus,
        time_min=10,
        array_parallelism=args.parallelism,
    )
    ex = make_executor(cfg, folder, kind="bench", job_name="eb-bench-slurm", executor="slurm")
    t0 = time.time()
    jobs = ex.map_array(_trivial, list(range(args.tasks)))
    t_submit = time.time() - t0
    results = []
    for j in jobs:
        left = args.timeout - (time.time() - t0)
        if left <= 0:
            raise TimeoutError(f"the bench array did not finish in {args.timeout} s; see squeue / {folder}")
        results.append(j.result())
    wall = time.time() - t0
    assert results == list(range(args.tasks)), f"unexpected results {results}"
    array_id = str(jobs[0].job_id).split("_")[0]
    times = []
    for _ in range(20):  # accounting is written asynchronously by slurmdbd
        times = _sacct_times(array_id)
        if len(times) >= args.tasks:
            break
        time.sleep(0.5)
    node = subprocess.run(["sinfo", "-h", "-o", "%c CPUs, %G, %m MB"], capture_output=True, text=True).stdout.strip()
    res = {
        "bench": "slurm",
        "tasks": args.tasks,
        "cpus_per_task": args.cpus,
        "gpus_per_task": args.gpus,
        "array_parallelism": args.parallelism,
        "submit_s": round(t_submit, 3),
        "wall_s": round(wall, 2),
        "per_task_s": round(wall / args.tasks, 3),
        "task_start_latency_s": {
            "mean": round(sum(s - t0 for s, _, _ in times) / len(times), 2) if times else None,
            "max": round(max(s - t0 for s, _, _ in times), 2) if times else None,
        },
        "task_elapsed_s_mean": round(sum(e for _, _, e in times) / len(times), 2) if times else None,
        "array_job": array_id,
        "node": node,
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.platform()}",
    }
    print(json.dumps(res, indent=None if args.json else 1))
    if tmp is not None:
        tmp.cleanup()
    return 0

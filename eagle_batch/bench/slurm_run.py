"""`eagle-batch bench slurm_run --tasks N [--json]`: a whole run on Slurm with faults, then `resume`, checked.

An extraction of N tasks with `extract.work=synthetic` (the real ArrayTask, state files, store writer and
commit protocol; pseudo states instead of a model) goes through `launch.submit_tasks`, so it is split into
arrays at the cluster's MaxArraySize (or `--max-array-size`). While the arrays run:

- killed: `--kill-frac` of the tasks get `kill -9` on their task process while it is writing (the pid
  its state file records, seen alive), spread over the run;
- cancelled: `--cancel-frac` get `scancel ARRAY_INDEX`, half while still pending, half while running.

When no array element is queued or running, `eagle-batch status RUN --json` and `eagle-batch resume RUN`
run in this process (twice: the second must submit nothing while the first's tasks are queued); then it
waits for the resubmission to drain and reads every store back.

Output (one JSON object): tasks, arrays, submit_s, status_s and the Slurm calls of one `status` (sacct,
squeue, scontrol: every subprocess the CLI starts is counted), killed / cancelled (tasks interrupted by
each fault, not finished when the arrays drained) and their sum, resubmitted (tasks the first `resume`
submitted), second_resume_submitted, the sets' equality, lost (planned sample ids absent from every store),
duplicated (sample ids present more than once across stores), data_mismatches (samples whose tokens differ
from what the task computes), wall_s (submit to all done), first_pass_s, resume_pass_s, node, machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from eagle_batch import environment
from eagle_batch.cli.common import float_at_least, int_at_least

SLURM_TOOLS = ("sacct", "squeue", "scontrol", "sbatch", "scancel", "sinfo", "srun")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", type=int_at_least(2), default=200, help="tasks in the run (default 200)")
    p.add_argument("--samples", type=int_at_least(1), default=4, help="synthetic samples per task (default 4)")
    p.add_argument("--sample-s", type=float_at_least(0.0), default=0.5, help="sleep after each commit, s")
    p.add_argument("--parallelism", type=int_at_least(1), default=64, help="slurm.array_parallelism")
    p.add_argument("--max-array-size", type=int_at_least(0), default=0, help="0: the cluster's MaxArraySize")
    p.add_argument("--kill-frac", type=float_at_least(0.0), default=0.05, help="share of tasks killed (-9)")
    p.add_argument("--cancel-frac", type=float_at_least(0.0), default=0.05, help="share of tasks scancel'ed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nice", type=int_at_least(0), default=10000, help="sbatch --nice of the run's arrays")
    p.add_argument("--dir", default="", help="parent folder of the run (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the run folder")
    p.add_argument("--timeout", type=float_at_least(10.0), default=3600, help="give up after this many seconds")


class CallCounter:
    """Counts the Slurm commands this process starts (subprocess.run / check_output / Popen)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._orig = subprocess.Popen.__init__

    def __enter__(self) -> "CallCounter":
        counter, orig = self, self._orig

        def init(popen, args, *a, **kw):
            argv = [args] if isinstance(args, str) else list(args)
            name = os.path.basename(str(argv[0]).split()[0]) if argv else ""
            if name in SLURM_TOOLS:
                counter.calls[name] += 1
            orig(popen, args, *a, **kw)

        subprocess.Popen.__init__ = init  # every subprocess helper goes through Popen
        return self

    def __exit__(self, *exc) -> None:
        subprocess.Popen.__init__ = self._orig

    def take(self) -> dict[str, int]:
        out, self.calls = dict(sorted(self.calls.items())), Counter()
        return out


def make_run(parent: Path, args: argparse.Namespace) -> Path:
    """A run folder with a plan of `--tasks` synthetic tasks and its config.yaml (no model, no prepare)."""
    from eagle_batch.config import load_config, save_config

    run = parent / f"slurm-run-{args.tasks}"
    (run / "prepared").mkdir(parents=True)
    tasks = [{"task_id": t, "rows": list(range(args.samples))} for t in range(args.tasks)]
    (run / "prepared" / "plan.json").write_text(json.dumps({"num_tasks": args.tasks, "tasks": tasks}))
    cfg_file = parent / "slurm-run.yaml"
    cfg_file.write_text(
        json.dumps(
            {
                "run_dir": str(run),
                "model": {"path": str(run)},
                "extract": {"work": "synthetic", "synthetic_sample_s": args.sample_s},
                "slurm": {
                    "executor": "slurm",
                    "gpus_per_node": 0,
                    "cpus_per_task": 1,
                    "time_min": 30,
                    "array_parallelism": args.parallelism,
                    "max_array_size": args.max_array_size,
                    "max_attempts": 1,
                    # A shared cluster's other jobs go first: this run only fills what they leave idle.
                    "additional_sbatch": [f"--nice={args.nice}"] if args.nice else [],
                },
                "store": {"chunk_tokens": 8, "shard_tokens": 64, "fsync": False},
            }
        )
    )
    save_config(load_config(cfg_file), run)
    return run


def element_tasks(run: Path) -> dict[str, int]:
    """{"ARRAY_INDEX": task} over every extraction array of the run."""
    from eagle_batch.launch.state import read_submissions

    return {s.task_job_id(t): t for s in read_submissions(run) if s.executor == "slurm" for t in s.tasks}


def live_elements(arrays: list[str]) -> dict[str, str]:
    """{"ARRAY_INDEX": squeue state} of the arrays' queued and running elements."""
    from eagle_batch.launch.slurm_query import _expand

    out = subprocess.run(
        ["squeue", "-h", "-r", "-j", ",".join(arrays), "-o", "%i|%T"], capture_output=True, text=True
    ).stdout
    live = {}
    for line in out.splitlines():
        jid, _, st = line.partition("|")
        for e in _expand(jid.strip()):
            live[e] = st.strip()
    return live


class Faults:
    """Kills and cancels `kill_n` / `cancel_n` tasks, spread over the run as its elements drain; never one of
    `spared` (tasks the caller interrupts itself)."""

    def __init__(self, run: Path, n: int, kill_n: int, cancel_n: int, rng: random.Random, spared: Iterable[int] = ()):
        self.run, self.n, self.rng = run, n, rng
        self.kill_n, self.cancel_n = kill_n, cancel_n
        self.killed: set[int] = set()
        self.cancelled: set[int] = set()
        self.spared = set(spared)

    def step(self, live: dict[str, str], tasks: dict[str, int]) -> None:
        from eagle_batch.launch import proc
        from eagle_batch.launch.state import read_state

        share = 1.0 - len(live) / self.n  # how far the run has drained: faults keep pace with it
        touched = self.killed | self.cancelled | self.spared
        pending = [e for e, st in live.items() if st == "PENDING" and tasks[e] not in touched]
        running = [e for e, st in live.items() if st == "RUNNING" and tasks[e] not in touched]
        # Half the cancels hit pending elements at once, the others running ones as the run goes.
        want_cancel = self.cancel_n // 2 + int((self.cancel_n - self.cancel_n // 2) * share + 0.5)
        pool = pending if len(self.cancelled) < self.cancel_n // 2 else running
        for e in self.rng.sample(pool, min(len(pool), want_cancel - len(self.cancelled))):
            if subprocess.run(["scancel", e], capture_output=True).returncode == 0:
                self.cancelled.add(tasks[e])
        # The i-th kill once the run is (i - 1/2) / kill_n drained: the last one before the final tasks.
        want_kill = min(self.kill_n, int(self.kill_n * share + 0.5))
        for e in self.rng.sample(running, len(running)):
            if len(self.killed) >= want_kill:
                break
            t = tasks[e]
            st = read_state(self.run, t)
            att = st.attempt if st else None
            # Its writer holds the lock and has reported (the attempt is recorded): kill it mid-write.
            if t in self.cancelled or att is None or att.job_id != e or att.outcome != "running":
                continue
            if proc.alive(att.pid, att.ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(att.pid, signal.SIGKILL)
                    self.killed.add(t)


def drain(run: Path, arrays: list[str], deadline: float, faults: Faults | None = None) -> None:
    while True:
        live = live_elements(arrays)
        if not live:
            return
        if time.time() > deadline:
            raise TimeoutError(f"{len(live)} elements of {', '.join(arrays)} still live; see squeue / {run}")
        if faults is not None:
            faults.step(live, element_tasks(run))
        time.sleep(1.0)


def cli(*argv: str) -> tuple[int, str]:
    from eagle_batch.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main([str(a) for a in argv])
    return rc, buf.getvalue()


def read_back(run: Path, n: int, samples: int) -> dict[str, int]:
    """Lost / duplicated sample ids over every store, and samples whose tokens differ from the task's."""
    import numpy as np

    from eagle_batch.launch.state import store_path
    from eagle_batch.launch.synthetic_work import synthetic_sample
    from eagle_batch.store import TaskStore

    seen: Counter[str] = Counter()
    mismatches = 0
    for t in range(n):
        path = store_path(run, t)
        if not path.is_dir():
            continue
        store = TaskStore(path)
        for i, sid in enumerate(store.sample_ids):
            seen[sid] += 1
            ids, mask = store.token_arrays(i)
            ref = synthetic_sample(t, int(sid.rsplit("-s", 1)[1]))
            mismatches += not (ref[0] == sid and np.array_equal(ids, ref[1]) and np.array_equal(mask, ref[2]))
        store.close()
    expected = {synthetic_sample(t, i)[0] for t in range(n) for i in range(samples)}
    return {
        "samples_expected": len(expected),
        "samples_present": len(seen),
        "lost": len(expected - set(seen)),
        "duplicated": sum(1 for c in seen.values() if c > 1),
        "unexpected": len(set(seen) - expected),
        "data_mismatches": int(mismatches),
    }


def run(args: argparse.Namespace) -> int:
    from eagle_batch.launch.slurm_query import have_slurm

    if not have_slurm():
        print(json.dumps({"error": "no Slurm here (sbatch not on PATH); start one with .ci/slurm-up.sh"}))
        return 1
    parent = Path(args.dir) if args.dir else None
    tmp = None
    if parent is None:
        tmp = tempfile.TemporaryDirectory(prefix="eb-bench-slurm-run-", dir=environment.bench_dir())
        parent = Path(tmp.name)
    parent.mkdir(parents=True, exist_ok=True)
    try:
        res = measure(make_run(parent, args), args)
    finally:
        if tmp is not None and not args.keep:
            tmp.cleanup()
    print(json.dumps(res, indent=None if args.json else 1))
    return 0 if res["holds"] else 1


def _not_done(run: Path) -> tuple[set[int], float, dict[str, int], dict]:
    """(tasks `status --json` says are not done, its seconds, the Slurm calls it made, its totals)."""
    with CallCounter() as calls:
        t0 = time.time()
        rc, out = cli("status", run, "--json")
        took = time.time() - t0
    if rc != 0:
        raise RuntimeError(f"eagle-batch status {run} --json exited {rc}")
    st = json.loads(out)
    return {r["task_id"] for r in st["tasks"] if r["state"] != "done"}, took, calls.take(), st["totals"]


def _resume(run: Path) -> tuple[list[int], float, dict[str, int]]:
    """(tasks one `eagle-batch resume RUN` submitted, its seconds, its Slurm calls)."""
    from eagle_batch.launch.state import read_submissions

    before = len(read_submissions(run))
    with CallCounter() as calls:
        t0 = time.time()
        rc, _ = cli("resume", run)
        took = time.time() - t0
    if rc != 0:
        raise RuntimeError(f"eagle-batch resume {run} exited {rc}")
    new = read_submissions(run)[before:]
    return sorted(t for s in new for t in s.tasks), took, calls.take()


def measure(run: Path, args: argparse.Namespace) -> dict:
    from eagle_batch.config import load_run_config
    from eagle_batch.launch.state import read_submissions
    from eagle_batch.launch.submit import submit_tasks

    n, rng = args.tasks, random.Random(args.seed)
    cfg = load_run_config(run)
    deadline = time.time() + args.timeout
    with CallCounter() as calls:
        t0 = time.time()
        submit_tasks(cfg, run, list(range(n)), kind="extract", executor="slurm")
        submit_s = time.time() - t0
    submit_calls = calls.take()
    arrays = [s.job_id for s in read_submissions(run)]
    faults = Faults(run, n, round(n * args.kill_frac), round(n * args.cancel_frac), rng)
    drain(run, arrays, deadline, faults)
    first_pass_s = time.time() - t0
    not_done, status_s, status_calls, totals_before = _not_done(run)
    resubmitted, resume_s, resume_calls = _resume(run)
    again, _, second_calls = _resume(run)  # while the first resume's tasks are queued or running
    new_arrays = [s.job_id for s in read_submissions(run)][len(arrays) :]
    drain(run, new_arrays, deadline)
    wall_s = time.time() - t0
    left, status_after_s, status_after_calls, totals_after = _not_done(run)
    data = read_back(run, n, args.samples)
    killed = faults.killed & not_done
    cancelled = faults.cancelled & not_done
    node = subprocess.run(["sinfo", "-h", "-o", "%c CPUs, %m MB"], capture_output=True, text=True).stdout.strip()
    res = {
        "bench": "slurm_run",
        "tasks": n,
        "samples_per_task": args.samples,
        "sample_s": args.sample_s,
        "array_parallelism": args.parallelism,
        "max_array_size": args.max_array_size or "cluster",
        "arrays": len(arrays),
        "array_sizes": [len(s.tasks) for s in read_submissions(run)[: len(arrays)]],
        "submit_s": round(submit_s, 2),
        "submit_slurm_calls": submit_calls,
        "first_pass_s": round(first_pass_s, 1),
        "kill_signals_sent": len(faults.killed),
        "cancels_sent": len(faults.cancelled),
        "killed": len(killed),
        "cancelled": len(cancelled),
        "killed_plus_cancelled": len(killed) + len(cancelled),
        "not_done_after_faults": len(not_done),
        "states_after_faults": totals_before["states"],
        "status_s": round(status_s, 2),
        "status_slurm_calls": status_calls,
        "resubmitted": len(resubmitted),
        "resubmitted_equals_killed_plus_cancelled": set(resubmitted) == killed | cancelled,
        "resume_s": round(resume_s, 2),
        "resume_slurm_calls": resume_calls,
        "resume_arrays": len(new_arrays),
        "second_resume_submitted": len(again),
        "second_resume_slurm_calls": second_calls,
        "resume_pass_s": round(wall_s - first_pass_s, 1),
        "wall_s": round(wall_s, 1),
        "all_done": totals_after["all_done"] and not left,
        "status_after_s": round(status_after_s, 2),
        "status_after_slurm_calls": status_after_calls,
        **data,
        "node": node,
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.platform()}",
    }
    res["holds"] = bool(
        res["resubmitted_equals_killed_plus_cancelled"]
        and not_done == killed | cancelled
        and not again
        and res["all_done"]
        and data["lost"] == 0
        and data["duplicated"] == 0
        and data["unexpected"] == 0
        and data["data_mismatches"] == 0
    )
    return res

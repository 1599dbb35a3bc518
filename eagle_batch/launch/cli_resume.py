"""`eagle-batch resume RUN [key=value ...]`: resubmit only the tasks that are not done and not queued."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run directory")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="slurm.* overrides for the resubmission (e.g. slurm.time_min=600)")
    p.add_argument("--wait", action="store_true", help="follow the new array to the end")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--dry-run", action="store_true", help="only print which tasks would be resubmitted")


def run(args: argparse.Namespace) -> int:
    from eagle_batch.config import ConfigError, load_run_config, save_config

    from .status import RESUMABLE, run_status
    from .submit import SubmitError, submit_tasks

    bad = [o for o in args.overrides if not o.startswith("slurm.")]
    if bad:
        raise ConfigError(f"resume only takes slurm.* overrides (got {', '.join(bad)}); data, model and extract "
                          "settings are fixed by the run's config.yaml.")
    cfg = load_run_config(args.run_dir, args.overrides)
    try:
        st = run_status(args.run_dir)
        rows = st["tasks"]
        todo = [r["task_id"] for r in rows if r["state"] in RESUMABLE]
        active = [r["task_id"] for r in rows if r["state"] in ("pending", "requeued", "running")]
        if not todo:
            print(f"nothing to resume in {args.run_dir}: {st['totals']['done']} done, {len(active)} queued or running.")
            return 0
        print(f"resubmitting {len(todo)} task(s): {', '.join(map(str, todo))}"
              + (f" ({len(active)} still queued or running are left alone)" if active else ""))
        if args.dry_run:
            return 0
        if args.overrides:
            save_config(cfg, args.run_dir)
        sub = submit_tasks(cfg, args.run_dir, todo, kind="resume")
    except SubmitError as e:
        print(f"eagle-batch resume: {e}", file=sys.stderr)
        return 1
    print(f"submitted {'Slurm array' if sub.executor == 'slurm' else 'local job'} {sub.job_id}")
    if args.wait:
        from .follow import follow

        return 0 if follow(args.run_dir, args.interval)["totals"]["all_done"] else 1
    return 0

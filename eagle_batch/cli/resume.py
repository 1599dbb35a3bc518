"""`eagle-batch resume RUN [key=value ...]`: resubmit only the tasks that are not done and not queued."""

from __future__ import annotations

import argparse
import sys

from eagle_batch.cli.common import add_interval_argument
from eagle_batch.ownership import private_dir, write_private


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run directory")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="slurm.* overrides for the resubmission (e.g. slurm.time_min=600); extract.check_disk=false "
        "submits without the disk check",
    )
    p.add_argument("--wait", action="store_true", help="follow the new array to the end")
    add_interval_argument(p)
    p.add_argument("--dry-run", action="store_true", help="only print which tasks would be resubmitted")
    p.add_argument(
        "--repair",
        action="store_true",
        help="first verify every task store that is not queued or running; damaged ones are "
        "truncated to the last sample before the first damaged shard and recomputed from there",
    )


def run(args: argparse.Namespace) -> int:
    from eagle_batch.config import ConfigError, check_values, load_run_config, save_config
    from eagle_batch.config.validate import check_plan_settings
    from eagle_batch.launch.disk_room import capture_room
    from eagle_batch.launch.state import arrays_of, read_submissions
    from eagle_batch.launch.status import RESUMABLE, run_status
    from eagle_batch.launch.store_match import check_stores_match
    from eagle_batch.launch.submit import SubmitError, submit_tasks

    bad = [o for o in args.overrides if not o.startswith(("slurm.", "extract.check_disk="))]
    if bad:
        raise ConfigError(
            f"resume only takes slurm.* overrides and extract.check_disk=false (got {', '.join(bad)}); data, "
            "model and extract settings are fixed by the run's config.yaml."
        )
    cfg = load_run_config(args.run_dir, args.overrides)
    # resume changes slurm.* only (the rest was checked when the run was prepared): those values, before anything
    # is repaired or resubmitted
    check_values(cfg, sections=("slurm",))
    try:
        if args.repair:
            _request_repairs(args.run_dir, dry_run=args.dry_run)
        st = run_status(args.run_dir)
        rows = st["tasks"]
        todo = [r["task_id"] for r in rows if r["state"] in RESUMABLE]
        active = [r["task_id"] for r in rows if r["state"] in ("pending", "requeued", "running")]
        if not todo:
            print(f"nothing to resume in {args.run_dir}: {st['totals']['done']} done, {len(active)} queued or running.")
            return 0
        check_stores_match(cfg, todo)  # a config.yaml edited since would fail every attempt of the task
        check_plan_settings(cfg)  # ... or finish the run under other settings than its finished tasks
        room = capture_room(cfg, todo, resume=True)  # a disk still full: refused, before anything is written
        print(
            f"resubmitting {len(todo)} task(s): {', '.join(map(str, todo))}"
            + (f" ({len(active)} still queued or running are left alone)" if active else "")
        )
        if room:
            print(room, file=sys.stderr)
        if args.dry_run:
            return 0
        if args.overrides:
            save_config(cfg, args.run_dir)
        sub = submit_tasks(cfg, args.run_dir, todo, kind="resume")
    except SubmitError as e:
        print(f"eagle-batch resume: {e}", file=sys.stderr)
        return e.exit_code
    if sub.executor == "slurm":
        arrays = arrays_of(read_submissions(args.run_dir), sub)
        print(f"submitted Slurm array{'s' if len(arrays) > 1 else ''} {', '.join(arrays)}")
    else:
        print(f"submitted local job {sub.job_id}")
    if args.wait:
        from eagle_batch.launch.follow import follow

        return 0 if follow(args.run_dir, args.interval, live=not args.no_progress)["totals"]["all_done"] else 1
    return 0


def _request_repairs(run_dir: str, dry_run: bool) -> list[int]:
    """Verify the stores of tasks not queued/running; write RUN/state/repair-XXXXX.json for damaged ones."""
    import json
    import time

    from eagle_batch.launch.state import repair_path, store_path
    from eagle_batch.launch.status import run_status
    from eagle_batch.store import verify

    damaged = []
    for r in run_status(run_dir)["tasks"]:
        t = r["task_id"]
        path = store_path(run_dir, t)
        if r["state"] in ("pending", "requeued", "running") or not path.exists():
            continue
        problems = verify(path)
        if not problems:
            continue
        damaged.append(t)
        print(
            f"task {t}: {len(problems)} problem(s) in {path}: {problems[0]}"
            + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        )
        if not dry_run:
            p = repair_path(run_dir, t)
            private_dir(p.parent, "the run's task state files")
            write_private(p, json.dumps({"time": time.time(), "problems": [str(x) for x in problems]}, indent=1))
    if not damaged:
        print("verify: no damaged task store.")
    return damaged

"""`eagle-batch status RUN [--json]`: one row per task and totals."""

from __future__ import annotations

import argparse
import json
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run directory (run_dir of the config)")
    p.add_argument("--json", action="store_true", help="print one JSON object: {run_dir, tasks: [...], totals}")
    p.add_argument("--wait", action="store_true", help="follow until no task is queued or running")


def _fmt_eta(s, state: str = "") -> str:
    if s is None:
        return "estimating" if state == "running" else "-"
    return time.strftime("%H:%M:%S", time.gmtime(s)) if s < 86400 else f"{s / 86400:.1f}d"


def run(args: argparse.Namespace) -> int:
    from eagle_batch.launch.status import progress_line, run_status

    if args.wait:
        from eagle_batch.launch.follow import follow

        st = follow(args.run_dir, live=not args.no_progress)
    else:
        st = run_status(args.run_dir)
    if args.json:
        print(json.dumps(st, indent=1))
        return 0
    jw = max([12] + [len(r["job_id"]) for r in st["tasks"]])
    hdr = (
        f"{'task':>5} {'state':<13} {'job':<{jw}} {'samples':>13} {'progress':>8} {'tok/s':>9} {'eta':>10} {'att':>3}"
        "  log / last error"
    )
    print(hdr)
    for r in st["tasks"]:
        samples = f"{r['samples_committed']}/{r['samples_total']}"
        line = (
            f"{r['task_id']:>5} {r['state']:<13} {r['job_id']:<{jw}} {samples:>13} {r['progress'] * 100:7.1f}% "
            f"{r['tok_s']:>9.0f} {_fmt_eta(r['eta_s'], r['state']):>10} {r['attempts']:>3}  {r['log']}"
        )
        print(line)
        if r["last_error"] and r["state"] != "done":
            print(f"{'':>5} error: {r['last_error']}")
    print(progress_line(st))
    return 0

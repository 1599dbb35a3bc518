"""`--wait`: follow a run until no task is pending/running, with one live progress line."""

from __future__ import annotations

import sys
import time

from eagle_batch.errors import UserError

from . import state as S
from .slurm_query import never_starts
from .status import progress_line, run_status


class StoppedFollowing(UserError):
    """Ctrl-C while following a run: the jobs are not this command's children and go on; the message says
    where they run and how to follow or stop them."""

    exit_code = 130


def follow(run_dir, interval_s: float = 5.0, out=None, live: bool = True) -> dict:
    """Poll `run_status` until nothing is queued or running, or a task's job is pending for a reason Slurm
    never lifts on its own (then its error says so and what to do); returns the final status.
    live=False (--no-progress): only the final progress line is printed."""
    # sys.stdout looked up per call, not bound at import: whoever replaced it since (pytest's capture,
    # a notebook) owns the stream now, and the import-time one may be closed.
    out = out if out is not None else sys.stdout
    try:
        return _follow(run_dir, interval_s, out, live)
    except KeyboardInterrupt:
        if out.isatty():
            out.write("\n")
            out.flush()
        raise StoppedFollowing(stopped_following(run_dir)) from None


def stopped_following(run_dir) -> str:
    """What Ctrl-C on `--wait` leaves behind, in the words of the executor that runs the tasks."""
    try:
        rows = run_status(run_dir)["tasks"]
        subs = S.read_submissions(run_dir)
    except (UserError, OSError):
        rows, subs = [], []
    active = [r for r in rows if r["state"] in ("pending", "requeued", "running")]
    last = subs[-1] if subs else None
    if not active:
        where = "no task of it is queued or running"
    elif last is not None and last.executor == "local":
        # launch.local starts each slot in a session of its own: the terminal's Ctrl-C never reaches it.
        where = f"its {len(active)} task(s) go on in the background on this machine (local job {last.job_id})"
    else:
        where = f"its {len(active)} task(s) go on in Slurm" + (f" (job {last.job_id})" if last else "")
    stop = f", stop them with `eagle-batch cancel {run_dir}`" if active else ""
    return f"stopped following {run_dir}: {where}; follow with `eagle-batch status {run_dir}`{stop}."


def _follow(run_dir, interval_s: float, out, live: bool) -> dict:
    tty = out.isatty() and live
    last = ""
    while True:
        status = run_status(run_dir)
        line = progress_line(status)
        if tty:
            out.write("\r\033[K" + line)
        elif line != last and live:
            out.write(line + "\n")
        out.flush()
        last = line
        stuck = [r for r in status["tasks"] if never_starts(r.get("pending_reason", ""))]
        if status["totals"]["active"] == 0 or stuck:
            if tty:
                out.write("\n")
            elif not live:
                out.write(line + "\n")
            if stuck:
                out.write(f"stopped following: task {stuck[0]['task_id']}: {stuck[0]['last_error']}\n")
            return status
        time.sleep(interval_s)

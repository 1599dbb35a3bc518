"""`--wait`: follow a run until no task is pending/running, with one live progress line."""

from __future__ import annotations

import sys
import time

from .slurm_query import never_starts
from .status import progress_line, run_status


def follow(run_dir, interval_s: float = 5.0, out=None) -> dict:
    """Poll `run_status` until nothing is queued or running, or a task's job is pending for a reason Slurm
    never lifts on its own (then its error says so and what to do); returns the final status."""
    # sys.stdout looked up per call, not bound at import: whoever replaced it since (pytest's capture,
    # a notebook) owns the stream now, and the import-time one may be closed.
    out = out if out is not None else sys.stdout
    tty = out.isatty()
    last = ""
    while True:
        status = run_status(run_dir)
        line = progress_line(status)
        if tty:
            out.write("\r\033[K" + line)
        elif line != last:
            out.write(line + "\n")
        out.flush()
        last = line
        stuck = [r for r in status["tasks"] if never_starts(r.get("pending_reason", ""))]
        if status["totals"]["active"] == 0 or stuck:
            if tty:
                out.write("\n")
            if stuck:
                out.write(f"stopped following: task {stuck[0]['task_id']}: {stuck[0]['last_error']}\n")
            return status
        time.sleep(interval_s)

"""Is a process of this machine still running? The one liveness check of local jobs and attempts.

`os.kill(pid, 0)` alone is not enough: a child that was killed stays a zombie until its parent reaps it
(the CLI that started a local job is that parent while `--wait` runs), and a pid can be reused by an
unrelated process after the first one ended. So a process is identified by (pid, start time): the start
time in clock ticks since boot, field 22 of /proc/PID/stat, recorded when the process is first seen.
A zombie counts as dead, and so does a process with SIGKILL pending: one killed inside a system call that
cannot be interrupted (an fsync of the store, say) keeps running until the call returns, and until then
`status` must not call it running. Without /proc (not Linux) only `os.kill(pid, 0)` is available.
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int:
    """The process's start time (clock ticks since boot); 0 when unknown (no such process, or no /proc)."""
    fields = _stat_fields(pid) if pid > 0 else None
    # After the name: [0] state, ... [19] starttime (field 22 of stat(5)).
    return int(fields[19]) if fields and len(fields) > 19 else 0


def alive(pid: int, ticks: int = 0) -> bool:
    """True when `pid` runs (not a zombie) and, if `ticks` is given, is the process that started then."""
    if pid <= 0:
        return False
    if not _PROC.is_dir():
        try:
            os.kill(pid, 0)
            return True
        except (OSError, ValueError):
            return False
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X") or _sigkill_pending(pid):
        return False
    return not ticks or len(fields) <= 19 or int(fields[19]) == ticks


_SIGKILL_BIT = 1 << 8  # signal 9 in the hex masks of /proc/PID/status


def _sigkill_pending(pid: int) -> bool:
    try:
        lines = (_PROC / str(pid) / "status").read_text().splitlines()
    except OSError:
        return False
    return any(int(line.split()[1], 16) & _SIGKILL_BIT for line in lines if line.startswith(("SigPnd:", "ShdPnd:")))

"""`eagle-batch cancel` for a local submission (launch.local): stop its slots and the process group of every
task they run, wait until those are gone, and say how many tasks were stopped.

A local task leads a process group of its own (what it started, vLLM's engine core and workers, is in it), so
signalling the group reaches all of it, as `scancel` reaches every process of a Slurm job step. The slots get
SIGTERM too: they start no further task and record the cancel (RUN/slurm/local-ID/cancelled), which `status`
shows as `cancelled`.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import proc
from . import state as S
from .local import CANCELLED, KILL_GRACE_S, SLOTS, _read_json, _signal_group, submission_alive


@dataclass
class LocalStop:
    job_id: str
    stopped: list[int] = field(default_factory=list)  # tasks that were running and were ended
    not_started: list[int] = field(default_factory=list)  # tasks of the submission that will not start now
    left_running: list[int] = field(default_factory=list)  # still alive after SIGKILL (should not happen)


def _running_tasks(run_dir: str, sub: S.Submission) -> dict[int, tuple[int, int]]:
    """{task id: (pid, start ticks)} of the submission's tasks whose attempt of this submission runs now."""
    out = {}
    for t in sub.tasks:
        st = S.read_state(run_dir, t)
        att = st.attempt if st else None
        if att and att.job_id == sub.task_job_id(t) and st.status == S.RUNNING and proc.alive(att.pid, att.ticks):
            out[t] = (att.pid, att.ticks)
    return out


def stop_local(run_dir: str, sub: S.Submission, grace_s: float = KILL_GRACE_S) -> LocalStop | None:
    """Stop a local submission that still runs (None when nothing of it is alive): SIGTERM to its slots and
    to each running task's process group, SIGKILL to the groups still there after `grace_s`."""
    sub_dir = Path(sub.folder)
    if not sub_dir.is_dir() or not submission_alive(sub_dir):
        return None
    (sub_dir / CANCELLED).write_text(str(time.time()))
    running = _running_tasks(run_dir, sub)
    done = {t for t in sub.tasks if (st := S.read_state(run_dir, t)) is not None and st.status == S.DONE}
    procs = list(_read_json(sub_dir / SLOTS) or []) + [_read_json(p) or {} for p in sub_dir.glob("slot-*.json")]
    for p in procs:
        pid, ticks = int(p.get("pid", 0)), int(p.get("ticks", 0))
        if proc.alive(pid, ticks):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
    for pid, _ in running.values():
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(proc.alive(*task) for task in running.values()):
        time.sleep(0.2)
    for pid, _ in running.values():  # what the task started and left behind (an engine core), or a task that
        _signal_group(pid, signal.SIGKILL)  # ignored SIGTERM for `grace_s`
    time.sleep(0.5 if running else 0)
    left = [t for t, task in running.items() if proc.alive(*task)]
    return LocalStop(
        job_id=sub.job_id,
        stopped=sorted(set(running) - set(left)),
        not_started=[t for t in sub.tasks if t not in running and t not in done],
        left_running=left,
    )

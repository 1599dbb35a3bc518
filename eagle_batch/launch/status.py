"""The state of every task of a run: what the task recorded (RUN/state) reconciled with what Slurm says.

A task's own state file says how far it got; only Slurm knows whether a job is pending, was cancelled,
hit its time limit or was killed (a killed process writes nothing). Task states:

    not_submitted  no extraction job ever ran it
    pending        queued (first time)
    requeued       queued again after a checkpoint (time limit / preemption) or a failed attempt
    running        a job is running it now
    done           every sample committed, store finalized
    failed         the job ended without finishing (raised, out of memory, node failure); resumable
    cancelled      scancel'ed; resumable
    timeout        killed at its time limit without requeue; resumable
    gave_up        failed on slurm.max_attempts attempts; resumable once fixed
    no_space       stopped on a full disk (its error says where and at which sample); resumable once freed
    unknown        Slurm has no record of its job (e.g. a pending array task cancelled alone); resumable
    damaged        `resume --repair` found problems in its store and the repair has not run yet; resumable
    lost           done, but its store was deleted or moved by hand since; resumable (extracted again)
    partial        its state file is missing (RUN/state deleted?) and its store holds committed samples; resumable
    missing        its state file is missing and its store holds no committed sample; resumable

Without a task's state file the stores are the truth (`without_state`): a store with its `complete` marker is
done, one with committed samples is partial; nothing is shown as failed for want of a state file.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from eagle_batch.ownership import check_run

from . import proc
from . import state as S
from .local import cancelled, claimed, exit_message, submission_alive, task_exit, task_log
from .run_view import Rerooter, RunView
from .slurm_query import is_live, job_states, never_starts, pending_reasons

FINISHED_OK = {"done"}
RESUMABLE = {
    "not_submitted",
    "failed",
    "cancelled",
    "timeout",
    "gave_up",
    "no_space",
    "unknown",
    "damaged",
    "lost",
    "partial",
    "missing",
}
ACTIVE = {"pending", "requeued", "running"}


@dataclass
class TaskRow:
    task_id: int
    state: str
    slurm_state: str
    job_id: str
    samples_committed: int
    samples_total: int
    tokens_committed: int
    tokens_total: int
    progress: float  # tokens committed / tokens total (samples if tokens unknown)
    tok_s: float  # capture tok/s: a running task's steady rate; a done task's average over its attempts
    eta_s: float | None
    attempts: int
    failures: int
    log: str
    last_error: str
    pending_reason: str = ""  # Slurm's reason while the task's job is pending (Priority, Resources, ...)


def _default_log(run_dir: Path, job_id: str) -> str:
    if not job_id:
        return ""
    return str(run_dir / S.SLURM_DIR / job_id / f"{job_id}_0_log.err")


def in_this_run(path: str, run_dir: Path) -> str:
    """A path recorded inside the run folder (records keep absolute paths), re-rooted at `run_dir` when the
    folder was moved since (run_view.Rerooter; `task_rows` keeps one for all its rows)."""
    return Rerooter(run_dir)(path)


def _tail_error(path: str) -> str:
    """Last informative line of a log (for jobs that died without recording an error)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        s = line.strip()
        if s and not s.startswith("submitit INFO"):
            return s[:300]
    return ""


def task_rows(run_dir: str | os.PathLike, num_tasks: int, view: RunView | None = None) -> list[TaskRow]:
    """One row per task. `view`: what was read of the run (a follower keeps one up to date); default: read it
    now (two directory reads, one open per state file: run_view.py)."""
    run_dir = Path(run_dir)
    view = view if view is not None else RunView.read(run_dir, num_tasks)
    plan, subs, listing = view.plan, view.submissions, view.listing
    latest = latest_submissions(subs)
    # Only the arrays that are some task's latest: the one sacct/squeue query per status names a bounded list.
    slurm_subs = list({s.job_id: s for s, _ in latest.values() if s.executor == "slurm"}.values())
    states = job_states(s.job_id for s in slurm_subs)
    reasons = pending_reasons(s.job_id for s in slurm_subs) if "PENDING" in states.values() else {}
    stores = listing.stores is not None or writes_stores(run_dir)
    reroot = Rerooter(run_dir)
    rows = []
    for t in range(num_tasks):
        st = view.states.get(t)
        sub, job_id = latest.get(t, (None, ""))
        sstate = states.get(job_id, "") if sub and sub.executor == "slurm" else ""
        # A finished task whose store is gone (deleted or moved by hand) is redone like a damaged one.
        lost = stores and st is not None and st.status == S.DONE and t not in (listing.stores or ())
        repair = t in listing.repairs or lost
        local = LocalView(sub, st, t) if sub is not None and sub.executor == "local" else None
        state = local.state(repair) if local else _derive(st, sub, sstate, repair=repair)
        if lost and state == "damaged":
            state = "lost"
        state, st, note = without_state(run_dir, t, state, sub) if st is None else (state, st, "")
        att = st.attempt if st else None
        if local:
            log = str(task_log(Path(sub.folder), t))
        elif att and att.log and (att.job_id == job_id or not sub):
            log = att.log
        else:
            log = _default_log(run_dir, job_id) if sub and sub.executor == "slurm" else ""
        log = reroot(log)
        last_error = st.last_error if st else ""
        if state == "lost":
            last_error = f"{S.store_path(run_dir, t)} no longer exists (deleted or moved?); `resume` extracts it again"
        elif local and state == "failed" and local.error:
            last_error = local.error  # what the slot saw: a kill, or a job that ended before the task ran
        elif state in ("failed", "gave_up", "no_space") and st and st.last_error and st.last_error_log:
            log = reroot(st.last_error_log)  # the log of the attempt that raised
        elif state == "failed" and not last_error:
            last_error = _tail_error(log)  # killed without recording an error (OOM, node failure)
        elif state in ("cancelled", "timeout", "unknown") and not last_error:
            slurm = f"Slurm state {sstate or 'unknown (no accounting record)'}"
            last_error = local_words(state, run_dir) if local else slurm
        last_error = note or last_error
        reason = reasons.get(job_id, "") if state == "pending" else ""
        last_error = _never_starts_message(reason, run_dir) if never_starts(reason) else last_error
        sc, stot = (st.samples_committed, st.samples_total) if st else (0, 0)
        tc, ttot = (st.tokens_committed, st.tokens_total) if st else (0, 0)
        stot, ttot = stot or plan.get(t, (0, 0))[0], ttot or plan.get(t, (0, 0))[1]
        progress = tc / ttot if ttot else (sc / stot if stot else (1.0 if state == "done" else 0.0))
        tok_s = (average_capture_rate(st) if state == "done" else st.tok_s) if st else 0.0
        eta = (ttot - tc) / tok_s if state == "running" and tok_s > 0 and ttot else None
        rows.append(
            TaskRow(
                task_id=t,
                state=state,
                slurm_state=sstate,
                job_id=job_id,
                samples_committed=sc,
                samples_total=stot,
                tokens_committed=tc,
                tokens_total=ttot,
                progress=round(progress, 4),
                tok_s=round(tok_s, 1),
                eta_s=round(eta, 1) if eta is not None else None,
                attempts=len(st.attempts) if st else 0,
                failures=st.failures if st else 0,
                log=log,
                last_error=last_error,
                pending_reason=reason,
            )
        )
    return rows


def _never_starts_message(reason: str, run_dir: Path) -> str:
    return (
        f"Slurm will not start it: pending for {reason} ({never_starts(reason)}); "
        f"`eagle-batch cancel {run_dir}`, correct the setting, then `eagle-batch resume {run_dir}`"
    )


class LocalView:
    """The state of one task of a local submission (launch.local), from its folder and the task's state.

    An attempt belongs to this submission when it started after it was submitted; an earlier attempt's
    record (a killed one still saying `running`) says nothing about this submission's progress."""

    def __init__(self, sub: S.Submission, st: S.TaskState | None, task_id: int):
        self.sub, self.st, self.task_id = sub, st, task_id
        self.dir = Path(sub.folder)
        self.error = ""

    def state(self, repair: bool) -> str:
        st, att = self.st, (self.st.attempt if self.st else None)
        ours = att is not None and att.started >= self.sub.time
        alive = submission_alive(self.dir)
        if not ours:  # this submission has not started the task (yet)
            if st is not None and st.status == S.DONE and not repair:
                return "done"
            if alive:
                return "pending"
            if repair:
                return "damaged"
            if cancelled(self.dir):
                return "cancelled"
            ex = task_exit(self.dir, self.task_id)
            if claimed(self.dir, self.task_id) and ex is not None:  # its process ended before it recorded a start
                tail = _tail_error(str(task_log(self.dir, self.task_id)))
                self.error = f"{exit_message(ex)} before the attempt started" + (f": {tail}" if tail else "")
            else:
                self.error = f"local job {self.sub.job_id} ended before this task started (slot logs in {self.dir})"
            return "failed"
        if st.status == S.DONE and repair:  # `resume --repair` found its finished store damaged since
            return "damaged"
        if st.status == S.RUNNING:
            if proc.alive(att.pid, att.ticks):
                return "running"
            # Dead without recording an outcome: killed. Its slot runs no further attempt after a kill.
            ex = task_exit(self.dir, self.task_id)
            if ex is not None and ex.get("ended", 0) >= att.started:
                self.error = exit_message(ex)
            else:
                self.error = (
                    "the task's process ended without recording why (killed?); its slot is ending "
                    "what the task left running"
                )
            return "cancelled" if cancelled(self.dir) else "failed"
        if st.status == S.CHECKPOINTED:  # committed at its time limit: the slot runs it again
            return "requeued" if alive else "timeout"
        if st.status == S.FAILED:
            return "requeued" if alive and st.failures < _max_attempts(self.dir) else "failed"
        return {S.RETRYING: "failed"}.get(st.status, st.status)


def without_state(
    run_dir: Path, task_id: int, state: str, sub: S.Submission | None
) -> tuple[str, S.TaskState | None, str]:
    """(row state, state rebuilt in memory, note) of a task without a state file (`state`: what the jobs alone
    say), from its store's committed record: a task not queued or running whose store exists, or any task
    once RUN/state is gone. A task never submitted whose store holds nothing stays `state`."""
    from eagle_batch.store.errors import StoreError
    from eagle_batch.store.format import COMPLETE_NAME
    from eagle_batch.store.record import read_record

    store, where = S.store_path(run_dir, task_id), S.state_path(run_dir, task_id)
    if state in ACTIVE or not (store.is_dir() or not where.parent.is_dir()):
        return state, None, ""
    try:
        record = read_record(store)
        n, tokens = int(record["num_samples"]), int(record["num_tokens"])
    except (OSError, ValueError, KeyError, TypeError, StoreError):  # no store or no readable record: none committed
        n = tokens = 0
    if n and (store / COMPLETE_NAME).is_file():
        return "done", S.TaskState(task_id, status=S.DONE, samples_committed=n, tokens_committed=tokens), ""
    if n:
        rebuilt = S.TaskState(task_id, status=S.FAILED, samples_committed=n, tokens_committed=tokens)
        return (
            "partial",
            rebuilt,
            (
                f"{where} is missing; its store {store} holds {n} committed sample(s): `eagle-batch resume {run_dir}` "
                "continues from there"
            ),
        )
    if sub is None:
        return state, None, ""
    return (
        "missing",
        None,
        f"{where} is missing and its store holds no committed sample: `eagle-batch resume {run_dir}` extracts it",
    )


def local_words(state: str, run_dir: Path) -> str:
    """Why a local task (launch.local) stopped, for the states whose Slurm twin is a Slurm job state."""
    if state == "cancelled":
        return f"stopped by `eagle-batch cancel`; `eagle-batch resume {run_dir}` continues from its last commit"
    if state == "timeout":
        return (
            "reached its time limit as often as the run allows (slurm.time_min, slurm.max_num_timeout); "
            f"`eagle-batch resume {run_dir}` continues from its last commit"
        )
    return f"its local job ended without a record of this task; `eagle-batch resume {run_dir}` runs it again"


def store_lost(run_dir: Path, task_id: int, st: S.TaskState | None) -> bool:
    """A task done whose store is gone (deleted or moved by hand since): its work must be done again."""
    return st is not None and st.status == S.DONE and not S.store_path(run_dir, task_id).is_dir()


def writes_stores(run_dir: Path) -> bool:
    """Whether the run's tasks write RUN/stores/task-XXXXX.zarr: extraction runs (extract.work=capture; a work of
    one's own that writes stores makes RUN/stores too), not regeneration runs."""
    from eagle_batch.config import ConfigError, load_run_config

    if (run_dir / "stores").is_dir():
        return True
    try:
        return load_run_config(run_dir).extract.work == "capture"
    except (ConfigError, OSError):
        return False


def _max_attempts(sub_dir: Path) -> int:
    """slurm.max_attempts the slot runs under (RUN/config.yaml; the folder is RUN/slurm/local-ID)."""
    from eagle_batch.config import ConfigError, load_run_config

    try:
        return int(load_run_config(sub_dir.parents[1]).slurm.max_attempts)
    except (ConfigError, OSError):
        return 0


def _derive(st: S.TaskState | None, sub: S.Submission | None, sstate: str, repair: bool = False) -> str:
    if st is not None and st.status == S.DONE and not repair:
        return "done"
    if repair and not is_live(sstate):
        return "damaged"
    if sub is None:
        return "not_submitted"
    if is_live(sstate):
        if sstate in ("RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT"):
            return "running"
        if st is not None and st.status in (S.CHECKPOINTED, S.RETRYING) or sstate == "REQUEUED":
            return "requeued"
        return "pending"
    if st is not None and st.status in (S.GAVE_UP, S.NO_SPACE):
        return st.status
    if sstate == "CANCELLED":
        return "cancelled"
    if sstate == "TIMEOUT":
        return "timeout"
    if sstate in ("FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED", "COMPLETED"):
        # COMPLETED without `done` in the state file: the job exited cleanly but the task is unfinished.
        return "failed"
    return "unknown"


def average_capture_rate(st) -> float:
    """A task's capture tok/s over its whole life: tokens committed / the wall seconds of its attempts
    (engine start-up included). A finished task shows this, not the steady rate of its last attempt, which
    a short task (one or two commits) never measures."""
    seconds = sum(max(0.0, (a.ended or a.started) - a.started) for a in st.attempts)
    return st.tokens_committed / seconds if seconds > 0 else 0.0


def totals(rows: list[TaskRow]) -> dict:
    by_state: dict[str, int] = {}
    for r in rows:
        by_state[r.state] = by_state.get(r.state, 0) + 1
    tc = sum(r.tokens_committed for r in rows)
    tt = sum(r.tokens_total for r in rows)
    running = [r for r in rows if r.state == "running"]
    rate = sum(r.tok_s for r in running)
    # Until every running task has a measured rate, an ETA would be a guess: "estimating".
    estimating = any(r.tok_s <= 0 for r in running)
    return {
        "tasks": len(rows),
        "states": dict(sorted(by_state.items())),
        "done": by_state.get("done", 0),
        "samples_committed": sum(r.samples_committed for r in rows),
        "samples_total": sum(r.samples_total for r in rows),
        "tokens_committed": tc,
        "tokens_total": tt,
        "progress": round(tc / tt, 4) if tt else round(by_state.get("done", 0) / max(1, len(rows)), 4),
        "tok_s": round(rate, 1),
        "eta_s": round((tt - tc) / rate, 1) if rate > 0 and tt and not estimating else None,
        "estimating": estimating,
        "all_done": bool(rows) and all(r.state == "done" for r in rows),
        # A task whose data is done can still be exiting in Slurm; `--wait` and chaining wait for that too.
        "active": sum(1 for r in rows if r.state in ACTIVE or is_live(r.slurm_state)),
        "time": time.time(),
    }


def latest_submissions(subs: list[S.Submission]) -> dict[int, tuple[S.Submission, str]]:
    """{task: (its latest extraction submission, the task's job id in it)}: one pass over the submissions
    (not one per task: a run of N tasks would make that N x N)."""
    latest: dict[int, tuple[S.Submission, str]] = {}
    for s in subs:
        if s.kind not in ("extract", "resume"):
            continue
        for i, t in enumerate(s.tasks):
            if s.executor == "local":
                latest[t] = (s, f"{s.job_id}_{t}")
            else:
                latest[t] = (s, f"{s.job_id}_{i}" if s.array else s.job_id)
    return latest


def run_status(run_dir: str | os.PathLike, view: RunView | None = None) -> dict:
    if view is None:  # a follower's view was read after its own check (Follower._full_read)
        check_run(run_dir)  # what the run's config and state say is read only from files of the owner's own
    num_tasks = S.plan_num_tasks(run_dir)
    view = view if view is not None else RunView.read(run_dir, num_tasks)
    rows = task_rows(run_dir, num_tasks, view)
    tot = totals(rows)
    if tot["all_done"]:  # nothing runs: the run's average capture rate, not 0
        tot["tok_s"] = round(run_average_rate(view.states.values(), tot["tokens_committed"]), 1)
    # vars(), not dataclasses.asdict: a row's fields are flat, and asdict's deep copy was most of the time of a
    # status of 10,000 tasks.
    return {"run_dir": str(run_dir), "tasks": [dict(vars(r)) for r in rows], "totals": tot}


def run_average_rate(states, tokens: int) -> float:
    """A finished run's capture tok/s: its tokens / the wall time from its first attempt's start to its last
    attempt's end (engine start-ups and any wait between tasks included), from the states already read."""
    attempts = [a for st in states for a in (getattr(st, "attempts", None) or [])]
    if not attempts:
        return 0.0
    span = max((a.ended or a.started) for a in attempts) - min(a.started for a in attempts)
    return tokens / span if span > 0 else 0.0


def progress_line(status: dict) -> str:
    t = status["totals"]
    states = " ".join(f"{k}={v}" for k, v in t["states"].items())
    eta = f" eta {t['eta_s']:.0f}s" if t["eta_s"] is not None else (" eta estimating" if t.get("estimating") else "")
    return (
        f"{t['done']}/{t['tasks']} tasks done | {t['progress'] * 100:5.1f}% tokens "
        f"({t['tokens_committed']}/{t['tokens_total']}) | {t['tok_s']:.0f} capture tok/s"
        f"{' (average)' if t['all_done'] else ''}{eta} | {states}"
    )

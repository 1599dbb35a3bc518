"""`ArrayTask(run_dir, task_id)`: one task of a run's array, a submitit `Checkpointable`.

The same object runs on every executor: a Slurm array task (submitit), a local slot's child process
(`launch.local` through `launch.run_task`), a hand-written sbatch script (`slurm/templates`). It runs the
run's work (`extract.work`: capture, regenerate, ...; see `launch.work`) on plan task `task_id`.

Life of an attempt:
1. Install the checkpoint-signal flag (`launch.job.StopSignal`).
2. Run the work. The attempt is recorded in RUN/state/task-XXXXX.json (job id, restart count, host, log)
   only once the work holds its output's lock (its first report): the state file belongs to the lock
   holder, so a duplicate job writes nothing.
3. Outcome:
   - done: state `done`.
   - stopped by the signal: state `checkpointed`, then submitit's handler pickles `checkpoint()`'s fresh
     task and requeues this array task (up to slurm.max_num_timeout).
   - a write found the disk full: state `no_space` (with the folder and the sample), no retry (every attempt
     would hit the same wall); the process exits 1. `resume` continues once there is room.
   - raised: `failures += 1`; below slurm.max_attempts the task requeues itself (`retrying`), else it is
     `gave_up` and the exception propagates, so Slurm marks it FAILED and `status` shows the error and log.
   - the output is locked by another live writer: a duplicate; it raises `DuplicateTaskError` without
     touching the output or the state file (both belong to the holder).
"""

from __future__ import annotations

import errno
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import submitit

from eagle_batch import environment
from eagle_batch.config import RunConfig, load_run_config
from eagle_batch.store import StoreLockedError
from eagle_batch.store.errors import StoreFullError

from . import state as S
from .job import StopSignal, global_rank, job_identity, last_line, request_requeue
from .work import TaskContext, resolve_work

# Commit times kept per task for the throughput-over-time plot (thinned by half beyond this).
HISTORY_POINTS = 400


class DuplicateTaskError(RuntimeError):
    """Another process holds this task's output: a duplicate submission; nothing was written."""


class _AttemptRecord:
    """The task's state file as this attempt updates it; written only after `start()` (lock held)."""

    def __init__(self, run_dir: Path, task_id: int, attempt: S.Attempt):
        self.run_dir = run_dir
        self.st = S.read_state(run_dir, task_id) or S.TaskState(task_id=task_id)
        self.attempt = attempt
        self.started = False
        self.base_tokens: int | None = None  # tokens already committed when this attempt started
        # (time, tokens) of this attempt's first commit: its rate is measured from there, not from its start,
        # so the engine's start-up (a minute or more) does not make the first estimates several times too slow.
        self.anchor: tuple[float, int] | None = None

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        st = self.st
        # Failures count per submission: a `resume` (new array job) gets max_attempts fresh attempts.
        array = environment.slurm_job().array_job_id or self.attempt.job_id.split("_")[0]
        if st.extra.get("array_job") != array:
            st.extra["array_job"], st.failures = array, 0
        for a in st.attempts:  # an earlier attempt that never recorded its end was killed
            if a.outcome == S.RUNNING:
                a.outcome, a.ended = "killed", a.ended or time.time()
        st.attempts.append(self.attempt)
        st.status, st.attempt_tokens, st.tok_s = S.RUNNING, 0, 0.0
        S.reserve_room(self.run_dir, st.task_id)  # given back to record the end on a full disk (write_state)

    def report(self, samples: int, tokens: int) -> None:
        """After a commit (and once when the work opened its output): committed totals, this attempt's steady
        rate, and a (time, tokens) point for the throughput plot."""
        self.start()
        st, now = self.st, time.time()
        hist = st.extra.setdefault("history", [])
        if self.base_tokens is None:  # the open: the attempt's first point is where it started
            hist.append([self.attempt.started, st.tokens_committed])
            self.base_tokens = tokens
        elif self.anchor is None and tokens > self.base_tokens:
            self.anchor = (now, tokens)
        hist.append([now, tokens])
        if len(hist) > HISTORY_POINTS:
            hist[:] = hist[::2]
        st.attempt_tokens = tokens - self.base_tokens
        st.samples_committed, st.tokens_committed = samples, tokens
        # 0 = not known yet (fewer than two commits with progress): `status` says "estimating".
        if self.anchor is not None and now > self.anchor[0] and tokens > self.anchor[1]:
            st.tok_s = (tokens - self.anchor[1]) / (now - self.anchor[0])
        S.write_state(self.run_dir, st)

    def set_totals(self, samples: int, tokens: int) -> None:
        self.st.samples_total, self.st.tokens_total = samples, tokens

    def end(self, outcome: str, status: str, error: str = "") -> None:
        self.start()
        self.attempt.ended = time.time()
        self.attempt.outcome, self.st.status = outcome, status
        if error:
            self.attempt.error = error
            self.st.last_error, self.st.last_error_log = error, self.attempt.log
        S.write_state(self.run_dir, self.st, use_reserve=True)
        S.release_reserve(self.run_dir, self.st.task_id)


class ArrayTask(submitit.helpers.Checkpointable):
    """Task `task_id` of the run in `run_dir`: runs the run's work and records its state."""

    def __init__(self, run_dir: str | os.PathLike, task_id: int, job_id: str = "", log: str = ""):
        self.run_dir = str(run_dir)
        self.task_id = int(task_id)
        # Set by launch.local, whose task processes are no submitit or Slurm jobs: how the attempt is named.
        self.job_id = job_id
        self.log = log

    def __repr__(self) -> str:
        return f"ArrayTask({self.run_dir!r}, {self.task_id})"

    # submitit calls this (through its handler, which StopSignal.hand_back runs after a clean stop) and
    # pickles the result for the requeued attempt. Everything that matters is on disk: a fresh task suffices.
    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(ArrayTask(self.run_dir, self.task_id, self.job_id, self.log))

    def __call__(self) -> dict:
        run_dir = Path(self.run_dir)
        rank = global_rank()
        if rank != 0:
            # slurm.nodes > 1: srun starts one process per node; the task (and its single writer) lives on
            # rank 0, which drives the whole allocation through the engine. The others only hold their node;
            # they must not open the output (the lock would call them duplicates).
            print(f"[eagle-batch] task {self.task_id}: rank {rank} idles; rank 0 runs the task", file=sys.stderr)
            return {"task_id": self.task_id, "rank": rank}
        cfg = load_run_config(run_dir)
        if self.job_id:
            job_id, restart, log = self.job_id, 0, self.log
        else:
            job_id, restart, log = job_identity()
        record = _AttemptRecord(run_dir, self.task_id, S.new_attempt(job_id, restart, log))
        repair_file = S.repair_path(run_dir, self.task_id)
        with StopSignal(f"task {self.task_id}") as stop:
            ctx = TaskContext(
                cfg=cfg,
                run_dir=run_dir,
                task_id=self.task_id,
                should_stop=stop,
                report=record.report,
                set_totals=record.set_totals,
                repair=repair_file.exists(),
            )
            try:
                finished = bool(resolve_work(cfg.extract.work)(ctx))
            except StoreLockedError as exc:
                raise self._duplicate(run_dir, exc) from exc
            except Exception as exc:
                return self._failed(cfg, record, exc)
        if finished:
            record.end(S.DONE, S.DONE)
            repair_file.unlink(missing_ok=True)
            return {
                "task_id": self.task_id,
                "samples": record.st.samples_committed,
                "tokens": record.st.tokens_committed,
            }
        if not stop.requested:
            # The work returned unfinished without being asked to stop: a bug in the work function.
            why = RuntimeError("the work returned before committing everything without a stop request")
            return self._failed(cfg, record, why)
        record.end(S.CHECKPOINTED, S.CHECKPOINTED)
        stop.hand_back()
        return {"task_id": self.task_id, "checkpointed": True}  # local runs: no requeue, stop here

    def _no_space(self, record: _AttemptRecord, folder: str) -> None:
        """A full disk: recorded as NO_SPACE (not a failure to retry: every attempt would hit the same wall), with
        where and at which sample; the process exits 1 (Slurm: FAILED, so an afterok training does not start)."""
        record.start()
        st = record.st
        n, total = st.samples_committed, st.samples_total
        why = (
            f"stopped: no space left on device in {folder} at sample {n + 1}{f' of {total}' if total else ''} "
            f"({n} sample(s) committed before it are kept); free space there (`df -h {folder}`), then "
            f"`eagle-batch resume {self.run_dir}`"
        )
        record.end("no_space", S.NO_SPACE, why)
        _to_log(lambda: print(f"[eagle-batch] task {self.task_id}: {why}", file=sys.stderr, flush=True))
        sys.exit(1)

    def _duplicate(self, run_dir: Path, exc: BaseException) -> DuplicateTaskError:
        msg = (
            f"task {self.task_id} of {run_dir} is already being written by another job ({exc}); this duplicate "
            f"wrote nothing. See `eagle-batch status {run_dir}`; cancel the other job first if it is stuck."
        )
        print(f"[eagle-batch] {msg}", file=sys.stderr, flush=True)
        return DuplicateTaskError(msg)

    def _failed(self, cfg: RunConfig, record: _AttemptRecord, exc: BaseException) -> dict:
        folder = full_folder(exc, self.run_dir)
        if folder is not None:
            self._no_space(record, folder)
        _to_log(lambda: traceback.print_exception(type(exc), exc, exc.__traceback__))
        record.start()  # before counting: a new submission's first attempt starts from 0 failures
        st, error = record.st, last_line(exc)
        st.failures += 1
        max_attempts = int(cfg.slurm.max_attempts)
        if st.failures < max_attempts and environment.slurm_job().inside and request_requeue():
            record.end("error", S.RETRYING, error)
            print(
                f"[eagle-batch] task {self.task_id}: attempt failed ({st.failures}/{max_attempts}): {error}; requeued",
                file=sys.stderr,
                flush=True,
            )
            # scontrol requeue kills this attempt shortly; leave now without a submitit result pickle.
            sys.exit(1)
        record.end("error", S.GAVE_UP if st.failures >= max_attempts else S.FAILED, error)
        if st.status == S.GAVE_UP:
            raise RuntimeError(
                f"task {self.task_id} gave up after {st.failures} failed attempts "
                f"(slurm.max_attempts={max_attempts}); last error: {error}"
            ) from exc
        raise exc


def full_folder(exc: BaseException, default: str) -> str | None:
    """The folder a full disk (or exhausted quota) stopped a write in, if `exc` or one of its causes is one
    (`default` when the write named no file: a log line)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, StoreFullError):
            return e.folder
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return str(Path(e.filename).parent) if e.filename else default
        e = e.__cause__ or e.__context__
    return None


def _to_log(write) -> None:
    """Write to the task's log unless it cannot be written (its disk is full): what the state records matters."""
    try:
        write()
    except OSError:
        pass

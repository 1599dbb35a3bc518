"""`ExtractTask(run_dir, task_id)`: one Slurm array task, a submitit `Checkpointable`.

Life of an attempt:
1. Record the attempt (job id, restart count, host, log path) in RUN/state/task-XXXXX.json.
2. Replace submitit's SIGUSR2 handler with one that only sets a flag. submitit's own handler would
   call `checkpoint()` from inside the signal handler, i.e. in the middle of whatever capture is doing
   (possibly half-way through a store append); with the flag, `run_capture(..., should_stop)` finishes
   its current batch, commits, and returns.
3. Run the work: open the task store writer (its lock refuses a duplicate task), load the task's samples,
   `run_capture`, finalize when every sample is committed. A restarted attempt resumes from the store's
   committed record, so committed samples are never recomputed or rewritten.
4. Outcome:
   - done: state `done`.
   - stopped by the signal: state `checkpointed`, then submitit's original handler runs (it pickles
     `checkpoint()`'s fresh task and `scontrol requeue`s this array task, up to slurm.max_num_timeout).
   - raised: `failures += 1`; below slurm.max_attempts the task requeues itself (`retrying`), else it
     is `gave_up` and the exception propagates, so Slurm marks it FAILED and `status` shows the error
     and log path.
   - the store is locked by another live writer: a duplicate; it raises `DuplicateTaskError` without
     touching the store or the state file (both belong to the holder).

The work is pluggable for tests: `EAGLE_BATCH_TEST_WORK=module:function` replaces `capture_work` with a
function of the same signature (test-only; never set it in production).
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from . import state as S

TEST_WORK_ENV = "EAGLE_BATCH_TEST_WORK"


class DuplicateTaskError(RuntimeError):
    """Another process holds this task's store: a duplicate submission; nothing was written."""


@dataclass
class TaskContext:
    """What a work function gets. `report(samples_committed, tokens_committed)` after each commit."""

    cfg: Any  # RunConfig
    run_dir: Path
    task_id: int
    should_stop: Callable[[], bool]
    report: Callable[[int, int], None]
    set_totals: Callable[[int, int], None]
    # `resume --repair` asked for it: open the store with repair=True (truncate to the last sample before
    # the first damaged shard; capture then recomputes from there).
    repair: bool = False


def _is_store_locked(exc: BaseException) -> bool:
    try:
        from eagle_batch.store import StoreLockedError  # type: ignore
    except Exception:  # store package not importable: fall back on the class name
        return type(exc).__name__ == "StoreLockedError"
    return isinstance(exc, StoreLockedError)


def capture_work(ctx: TaskContext) -> bool:
    """The real work: prepared samples -> run_capture -> task store. Returns True when the task is done."""
    from eagle_batch.capture import run_capture
    from eagle_batch.data import PreparedDataset
    from eagle_batch.store import TaskStoreWriter

    samples = PreparedDataset(ctx.run_dir).task_samples(ctx.task_id)
    ctx.set_totals(len(samples), int(sum(len(s.input_ids) for s in samples)))
    # Progress is what the store committed: the writer reports its record once the lock is held and after
    # every commit, whichever way capture appends (per sample or per engine step's block).
    writer = TaskStoreWriter.open(
        S.store_path(ctx.run_dir, ctx.task_id),
        _store_spec(ctx.cfg),
        ctx.cfg.store,
        repair=ctx.repair,
        on_commit=ctx.report,
    )
    try:
        if writer.is_complete:
            return True
        run_capture(ctx.cfg, samples, writer, should_stop=ctx.should_stop)
        if set(writer.committed_sample_ids) >= {s.sample_id for s in samples}:
            writer.finalize()
            return True
        return False
    finally:
        writer.close()


def _store_spec(cfg):
    """The StoreSpec for this run: the same layer ids and hidden size capture resolves from the config."""
    from eagle_batch.config import model_info, resolve_layer_ids
    from eagle_batch.store import StoreSpec

    info = model_info(cfg.model.path)
    return StoreSpec.from_config(cfg, resolve_layer_ids(cfg.model, info), info.hidden_size)


def resolve_work() -> Callable[[TaskContext], bool]:
    spec = os.environ.get(TEST_WORK_ENV, "")
    if not spec:
        return capture_work
    mod, _, fn = spec.partition(":")
    if not fn:
        raise ValueError(f"{TEST_WORK_ENV}={spec!r} must be 'module:function'")
    return getattr(importlib.import_module(mod), fn)


def _job_identity() -> tuple[str, int, str, str]:
    """(job id, restart count, stdout path, stderr path) of this process, as submitit or Slurm name it."""
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    try:
        env = submitit.JobEnvironment()
        job_id = str(env.job_id)
        paths = env.paths
        return job_id, restart, str(paths.stdout), str(paths.stderr)
    except RuntimeError:  # not inside submitit: a hand-written sbatch script (slurm/), or called directly
        e = os.environ
        if e.get("SLURM_ARRAY_JOB_ID"):
            return f"{e['SLURM_ARRAY_JOB_ID']}_{e.get('SLURM_ARRAY_TASK_ID', '0')}", restart, "", ""
        if e.get("SLURM_JOB_ID"):
            return e["SLURM_JOB_ID"], restart, "", ""
        return f"local-{os.getpid()}", restart, "", ""


def _global_rank() -> int:
    try:
        return int(submitit.JobEnvironment().global_rank)
    except RuntimeError:
        return 0


def _last_line(exc: BaseException) -> str:
    lines = [ln for ln in traceback.format_exception_only(type(exc), exc) if ln.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


class ExtractTask(submitit.helpers.Checkpointable):
    """One array task: extract hidden states for task `task_id` of the run in `run_dir`."""

    def __init__(self, run_dir: str | os.PathLike, task_id: int, job_id: str = "", log: str = ""):
        self.run_dir = str(run_dir)
        self.task_id = int(task_id)
        # Set by launch.local, whose task processes are no submitit or Slurm jobs: how the attempt is named.
        self.job_id = job_id
        self.log = log

    def __repr__(self) -> str:
        return f"ExtractTask({self.run_dir!r}, {self.task_id})"

    # submitit calls this (through its handler, which we call ourselves after a clean stop) and pickles
    # the result for the requeued attempt. Everything that matters is on disk, so a fresh task is enough.
    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(ExtractTask(self.run_dir, self.task_id, self.job_id, self.log))

    def __call__(self) -> dict:
        from eagle_batch.config import load_run_config

        run_dir = Path(self.run_dir)
        rank = _global_rank()
        if rank != 0:
            # slurm.nodes > 1: srun starts one process per node; the task (and its single store writer)
            # lives on rank 0, which drives the whole allocation through the engine. The others only
            # hold their node; they must not open the store (the lock would call them duplicates).
            print(f"[eagle-batch] task {self.task_id}: rank {rank} idles; rank 0 runs the task", file=sys.stderr)
            return {"task_id": self.task_id, "rank": rank}
        cfg = load_run_config(run_dir)
        if self.job_id:
            job_id, restart, out_log, err_log = self.job_id, 0, self.log, self.log
        else:
            job_id, restart, out_log, err_log = _job_identity()
        stop = {"flag": False}
        original = signal.getsignal(signal.SIGUSR2)

        def on_usr2(signum, frame):  # only a flag: the work stops at its next commit
            print(
                f"[eagle-batch] task {self.task_id}: got SIGUSR2 (time limit or preemption): committing and requeueing",
                file=sys.stderr,
                flush=True,
            )
            stop["flag"] = True

        signal.signal(signal.SIGUSR2, on_usr2)
        previous = S.read_state(run_dir, self.task_id)
        st = previous or S.TaskState(task_id=self.task_id)
        attempt = S.new_attempt(job_id, restart, err_log or out_log)
        t_start = time.time()
        base = {"tokens": None}  # tokens already committed when this attempt started

        def report(samples: int, tokens: int) -> None:
            # (time, tokens committed) at every commit, for throughput-over-time plots (demo report);
            # an attempt's first point is where it started. Thinned by half past 400 points.
            hist = st.extra.setdefault("history", [])
            if base["tokens"] is None:
                hist.append([t_start, st.tokens_committed])
            hist.append([time.time(), tokens])
            if len(hist) > 400:
                hist[:] = hist[::2]
            if base["tokens"] is None:
                base["tokens"] = tokens
            st.attempt_tokens = tokens - base["tokens"]
            st.samples_committed, st.tokens_committed = samples, tokens
            el = time.time() - t_start
            st.tok_s = st.attempt_tokens / el if el > 0 else 0.0
            S.write_state(run_dir, st)

        def set_totals(samples: int, tokens: int) -> None:
            st.samples_total, st.tokens_total = samples, tokens

        repair_file = S.repair_path(run_dir, self.task_id)
        ctx = TaskContext(
            cfg=cfg,
            run_dir=run_dir,
            task_id=self.task_id,
            should_stop=lambda: stop["flag"],
            report=report,
            set_totals=set_totals,
            repair=repair_file.exists(),
        )
        started = False

        def start() -> None:
            # Called once the writer lock is held (first report/totals) or before work without a store:
            # the state file belongs to the lock holder, so a duplicate must not write it.
            nonlocal started
            if started:
                return
            started = True
            # Failures count per submission: a `resume` (new array job) gets max_attempts fresh attempts.
            array = os.environ.get("SLURM_ARRAY_JOB_ID") or job_id.split("_")[0]
            if st.extra.get("array_job") != array:
                st.extra["array_job"], st.failures = array, 0
            for a in st.attempts:  # an earlier attempt that never recorded its end was killed
                if a.outcome == S.RUNNING:
                    a.outcome, a.ended = "killed", a.ended or time.time()
            st.attempts.append(attempt)
            st.status, st.attempt_tokens, st.tok_s = S.RUNNING, 0, 0.0

        def report_started(samples: int, tokens: int) -> None:
            start()
            report(samples, tokens)

        ctx.report = report_started
        work = resolve_work()
        try:
            finished = bool(work(ctx))
        except Exception as exc:
            if _is_store_locked(exc):
                msg = (
                    f"task {self.task_id} of {run_dir} is already being written by another job ({exc}); "
                    "this duplicate wrote nothing. See `eagle-batch status "
                    f"{run_dir}`; cancel the other job first if it is stuck."
                )
                print(f"[eagle-batch] {msg}", file=sys.stderr, flush=True)
                raise DuplicateTaskError(msg) from exc
            start()
            return self._failed(run_dir, cfg, st, attempt, exc)
        start()
        attempt.ended = time.time()
        if finished:
            attempt.outcome = st.status = S.DONE
            S.write_state(run_dir, st)
            repair_file.unlink(missing_ok=True)
            return {"task_id": self.task_id, "samples": st.samples_committed, "tokens": st.tokens_committed}
        if not stop["flag"]:
            # The work returned unfinished without being asked to stop: a bug in the work function.
            return self._failed(
                run_dir,
                cfg,
                st,
                attempt,
                RuntimeError("the work returned before committing every sample without a stop request"),
            )
        attempt.outcome = st.status = S.CHECKPOINTED
        S.write_state(run_dir, st)
        self._hand_to_submitit(original)
        return {"task_id": self.task_id, "checkpointed": True}  # local runs: no requeue, stop here

    def _hand_to_submitit(self, original) -> None:
        """Run submitit's checkpoint-and-requeue now that our data is committed (requeues and exits)."""
        signal.signal(signal.SIGUSR2, original)
        if not callable(original):
            return
        if _host_requeue():
            # Inside a container without the Slurm client: submitit still pickles checkpoint(), but the
            # `scontrol requeue` it would run is left to the batch script's teardown, on the host.
            env = getattr(getattr(original, "__self__", None), "env", None)
            if env is not None:
                env._requeue = lambda countdown: _request_host_requeue()
        original(signal.SIGUSR2, None)

    def _failed(self, run_dir: Path, cfg, st: S.TaskState, attempt: S.Attempt, exc: BaseException) -> dict:
        traceback.print_exception(type(exc), exc, exc.__traceback__)
        attempt.ended = time.time()
        attempt.outcome = "error"
        attempt.error = _last_line(exc)
        st.failures += 1
        st.last_error, st.last_error_log = attempt.error, attempt.log
        max_attempts = int(cfg.slurm.max_attempts)
        on_slurm = "SLURM_ARRAY_JOB_ID" in os.environ or "SLURM_JOB_ID" in os.environ
        if st.failures < max_attempts and on_slurm and self._requeue_self():
            st.status = S.RETRYING
            S.write_state(run_dir, st)
            print(
                f"[eagle-batch] task {self.task_id}: attempt failed ({st.failures}/{max_attempts}): "
                f"{attempt.error}; requeued",
                file=sys.stderr,
                flush=True,
            )
            # scontrol requeue kills this attempt shortly; leave now without a submitit result pickle.
            sys.exit(1)
        st.status = S.GAVE_UP if st.failures >= max_attempts else S.FAILED
        S.write_state(run_dir, st)
        if st.status == S.GAVE_UP:
            raise RuntimeError(
                f"task {self.task_id} gave up after {st.failures} failed attempts "
                f"(slurm.max_attempts={max_attempts}); last error: {attempt.error}"
            ) from exc
        raise exc

    @staticmethod
    def _requeue_self() -> bool:
        try:
            job_id = str(submitit.JobEnvironment().job_id)
        except RuntimeError:
            return False
        if _host_requeue():
            return _request_host_requeue()
        r = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            print(f"[eagle-batch] scontrol requeue {job_id} failed: {r.stderr.strip()}", file=sys.stderr)
        return r.returncode == 0


HOST_REQUEUE_ENV = "EAGLE_BATCH_HOST_REQUEUE"


def _host_requeue() -> bool:
    """True when the batch script (host side) does the requeue: containers without `scontrol`.

    launch.submit adds, for container runtimes, `export EAGLE_BATCH_HOST_REQUEUE=<dir>` before srun and a
    teardown after it that requeues the job if the task left a request file in <dir>.
    """
    return bool(os.environ.get(HOST_REQUEUE_ENV)) and os.environ.get("SLURM_JOB_ID") is not None


def _request_host_requeue() -> bool:
    d = Path(os.environ[HOST_REQUEUE_ENV])
    d.mkdir(parents=True, exist_ok=True)
    (d / os.environ["SLURM_JOB_ID"]).write_text(os.environ["SLURM_JOB_ID"])
    print(
        f"[eagle-batch] requeue of job {os.environ['SLURM_JOB_ID']} requested from the batch script ({d})",
        file=sys.stderr,
        flush=True,
    )
    return True

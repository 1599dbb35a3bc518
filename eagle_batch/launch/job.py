"""What every eagle-batch Slurm job does around its work: stop at the checkpoint signal, requeue.

Both job kinds (`launch.task.ArrayTask`, one task of a run's array; `launch.train_job.TrainTask`, one
training run) are submitit `Checkpointable`s that use this module the same way:

    with StopSignal(f"task {t}") as stop:      # SIGUSR2 now only sets a flag
        finished = work(should_stop=stop)      # the work polls stop() at safe points, commits, returns
    if not finished and stop.requested:
        stop.hand_back()                       # submitit pickles checkpoint() and requeues the job

Why a flag: before the time limit (`slurm.signal_delay_s`) or on preemption Slurm sends SIGUSR2, and
submitit's own handler calls `checkpoint()` from inside the signal handler, i.e. in the middle of
whatever the job is doing (half-way through a store append or an optimizer step). With the flag the work
reaches a consistent point first; only then does submitit's handler run (`hand_back`), which pickles the
job `checkpoint()` returns and requeues it (`scontrol requeue`, at most slurm.max_num_timeout times).

Why the signal is blocked: Slurm sends it to every process of the job step, not only to this one, and
SIGUSR2's default action ends a process. The processes the work starts (vLLM's engine core and tensor-
parallel workers, the training ranks and their data workers, multiprocessing's resource tracker) would die
mid-step and fail the task instead of letting it commit. While StopSignal is entered, SIGUSR2 is blocked in
this thread, so every thread and process started meanwhile inherits the block and never sees it; a thread
of StopSignal's own waits for the signal (`sigwait`) and sets the flag, and the work passes the
request on to its children where they must stop too (`launch.local_train`).

Inside a container without the Slurm client, `scontrol` is not there: the batch script that launch.submit
writes for container runtimes exports EAGLE_BATCH_HOST_REQUEUE and, after srun returns, requeues the job on
the host when the task left a request file (`host_requeue_setup`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import submitit

from eagle_batch import environment


class StopSignal:
    """While entered (in the main thread), SIGUSR2 sets `requested` instead of running submitit's handler
    (kept in `previous`), and is blocked for what the work starts (module docstring).

    Callable: `stop()` is the `should_stop` a work function polls."""

    def __init__(self, what: str):
        self.what = what
        self.requested = False
        self.previous = None
        self._mask: set[signal.Signals] = set()
        self._ended = threading.Event()
        self._waiter: threading.Thread | None = None

    def _on_signal(self, signum, frame) -> None:  # a flag only: the work stops at its next safe point
        print(
            f"[eagle-batch] {self.what}: got SIGUSR2 (time limit or preemption): committing and requeueing",
            file=sys.stderr,
            flush=True,
        )
        self.requested = True

    def _wait_for_signal(self) -> None:
        # sigwait, not sigtimedwait: CPython's sigtimedwait returns a siginfo when the wait is interrupted
        # (a SIGSTOP/SIGCONT of the task) past its timeout, which would read as a request. __exit__ wakes it.
        while True:
            signal.sigwait({signal.SIGUSR2})
            if self._ended.is_set():
                return
            self._on_signal(signal.SIGUSR2, None)

    def __call__(self) -> bool:
        return self.requested

    def __enter__(self) -> StopSignal:
        self.previous = signal.getsignal(signal.SIGUSR2)
        # The handler serves threads that were started before and so do not block the signal.
        signal.signal(signal.SIGUSR2, self._on_signal)
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
        self._ended.clear()
        self._waiter = threading.Thread(target=self._wait_for_signal, name="eagle-batch-stop-signal", daemon=True)
        self._waiter.start()  # after the block: it inherits it, as sigwait requires
        return self

    def __exit__(self, *exc) -> None:
        self._ended.set()
        if self._waiter is not None:
            signal.pthread_kill(self._waiter.ident, signal.SIGUSR2)  # to the waiting thread only: it ends
            self._waiter.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        signal.signal(signal.SIGUSR2, self.previous)

    def hand_back(self) -> None:
        """Run submitit's checkpoint-and-requeue now that the work's data is committed (it requeues and
        exits the job). Outside submitit (the local executor, a plain sbatch script) there is nothing to
        hand back to: the caller reports the job as checkpointed and returns."""
        original = self.previous
        signal.signal(signal.SIGUSR2, original)
        if not callable(original):
            return
        host_dir = environment.host_requeue_dir()
        if host_dir is not None:
            # submitit still pickles checkpoint(); the `scontrol requeue` it would run is left to the host.
            env = getattr(getattr(original, "__self__", None), "env", None)  # submitit's SignalHandler.env
            if env is not None:
                env._requeue = lambda countdown: _leave_host_request(host_dir)
        original(signal.SIGUSR2, None)


def request_requeue() -> bool:
    """Requeue this submitit job after a failed attempt: through the host's batch script in containers, else
    `scontrol requeue`. False outside submitit (a plain sbatch script requeues itself; the local executor
    runs the next attempt) or when the requeue failed (said on stderr)."""
    try:
        job_id = str(submitit.JobEnvironment().job_id)
    except RuntimeError:
        return False
    host_dir = environment.host_requeue_dir()
    if host_dir is not None:
        return _leave_host_request(host_dir)
    r = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        print(f"[eagle-batch] scontrol requeue {job_id} failed: {r.stderr.strip()}", file=sys.stderr)
    return r.returncode == 0


def _leave_host_request(host_dir: Path) -> bool:
    """Ask the batch script on the host to requeue this job once srun returns (see host_requeue_setup)."""
    job_id = environment.slurm_job().job_id
    host_dir.mkdir(parents=True, exist_ok=True)
    (host_dir / job_id).write_text(job_id)
    print(f"[eagle-batch] requeue of job {job_id} requested from the batch script ({host_dir})", file=sys.stderr)
    return True


def host_requeue_setup(requeue_dir: Path) -> tuple[list[str], list[str]]:
    """(setup lines, teardown lines) of a batch script whose job requeues itself from the host side."""
    var = environment.HOST_REQUEUE
    setup = [f"export {var}={shlex.quote(str(requeue_dir))}"]
    teardown = [
        f'if [ -f "${var}/$SLURM_JOB_ID" ]; then rm -f "${var}/$SLURM_JOB_ID"; scontrol requeue "$SLURM_JOB_ID"; fi'
    ]
    return setup, teardown


def job_identity() -> tuple[str, int, str]:
    """(job id, restart count, log path) of this process as submitit or Slurm name it."""
    job = environment.slurm_job()
    try:
        env = submitit.JobEnvironment()
        return str(env.job_id), job.restart_count, str(env.paths.stderr)
    except RuntimeError:  # not inside submitit: a hand-written sbatch script (slurm/), or called directly
        if job.inside:
            return job.task_job_id, job.restart_count, ""
        return f"local-{os.getpid()}", job.restart_count, ""


def global_rank() -> int:
    """This process's rank among the job's processes (srun starts one per node); 0 outside submitit."""
    try:
        return int(submitit.JobEnvironment().global_rank)
    except RuntimeError:
        return 0


def last_line(exc: BaseException) -> str:
    """The exception as one line, as `status` shows it."""
    lines = [ln for ln in traceback.format_exception_only(type(exc), exc) if ln.strip()]
    return lines[-1].strip() if lines else type(exc).__name__

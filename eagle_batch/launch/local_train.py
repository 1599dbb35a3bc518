"""The trainer's ranks as child processes of this process, started again from the draft's last checkpoint
when one crashes: `eagle-batch train --local`, and a single-node Slurm training task (`launch.train_job`).

`run_local(cfg, nproc, should_stop)` returns the trainer's result (`eagle_batch.train.train`). Invariants:

- With `train.max_restarts` > 0 or more than one rank, each attempt runs the ranks as spawned children
  (a file rendezvous per attempt: a crashed attempt's rendezvous file is never reused). With neither, the
  trainer runs in this process.
- A rank that dies of a crash that says nothing about the input is restarted: killed by a signal (CUDA's
  abort on an asynchronous "unspecified launch failure", a segfault, the OOM killer) or an exception that
  names a device fault (`DEVICE_FAULTS`) or a data worker's death (`train.data.is_worker_death`). Every rank is started
  again (torch stops the others when one fails) and resumes from RUN/train/<name>/checkpoints/latest, so at
  most `train.checkpoint_every` steps are trained twice; the data order is the uninterrupted run's (the
  trainer's resume rebuilds the epoch plan). Each restart is an `{"event": "restart"}` line in metrics.jsonl
  and a line on stderr.
- A UserError in a rank (data of another model, a checkpoint of another shape) comes back to this process
  as itself: one line, no traceback, never retried. Any other exception is a bug: raised, not retried.
- `train.max_time_s` counts from the first attempt's start: a restart gets what is left (at least 1 s, so a
  run restarted past its deadline ends after one step, exported, as an unbroken one would have).
- After `train.max_restarts` restarts the next crash is a `TrainingCrashed` naming the last checkpoint; a
  later `eagle-batch train` with the same config resumes from it.
- `should_stop()` (the Slurm task's SIGUSR2 flag, `launch.job.StopSignal`) is polled while the ranks run
  and, once true, reaches every rank through an event they poll after each step: they checkpoint and
  return "stopped". The ranks never take SIGUSR2 themselves: started under StopSignal, they inherit its
  block of the signal Slurm sends to every process of the step.
"""

from __future__ import annotations

import copy
import faulthandler
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eagle_batch import environment
from eagle_batch.config import RunConfig
from eagle_batch.errors import UserError
from eagle_batch.store.durable import write_atomic, write_json_atomic

# Text in a rank's exception that makes its crash worth a restart: the device failed under the step (a
# CUDA fault reported at a later call, a collective whose peer died), not the data or the code.
DEVICE_FAULTS = ("CUDA error", "AcceleratorError", "cudaError", "CUBLAS_STATUS", "CUDNN_STATUS", "NCCL error")

_USER_ERROR_EXIT = 3  # a rank's exit status after it wrote its UserError for the parent
_POLL_S = 0.5  # how often the parent looks at should_stop() while the ranks run


class TrainingCrashed(UserError):
    """The trainer crashed more often than `train.max_restarts` allows; the message names the last
    checkpoint, which a new `eagle-batch train` with the same config resumes from. The work failed: exit 1."""

    exit_code = 1


@dataclass(frozen=True)
class Crash:
    """How an attempt ended when it did not finish."""

    why: str  # "rank 0 was killed by signal SIGABRT", or an exception's last line
    restartable: bool
    error: Exception  # what torch.multiprocessing raised: re-raised as it is when not restartable (a bug)


def run_local(cfg: RunConfig, nproc: int = 1, should_stop: Callable[[], bool] = lambda: False) -> dict:
    """Train here, restarting after crashes (module docstring); returns the trainer's result."""
    import multiprocessing

    from eagle_batch.train.trainer import output_dir, train

    nproc = max(1, int(nproc))
    limit = int(cfg.train.max_restarts)
    if nproc == 1 and limit <= 0:
        return train(cfg, should_stop=should_stop)
    out = output_dir(cfg)
    started = time.monotonic()
    # One event for every attempt: a restart after the stop was asked for stops at its first step.
    stop_event = multiprocessing.get_context("spawn").Event()
    for restart in range(limit + 1):
        ended = _attempt(_with_time_left(cfg, started), nproc, stop_event, should_stop)
        if isinstance(ended, dict):
            return ended
        if not ended.restartable:
            raise ended.error
        where = _checkpoint_note(out)
        if restart == limit:
            raise TrainingCrashed(
                f"the trainer of {out} crashed {limit + 1} time(s), the last time: {ended.why}. {where}; "
                "`eagle-batch train` with the same config resumes from it (train.max_restarts sets how many "
                "crashes one command survives)."
            )
        print(
            f"[eagle-batch train] {ended.why}; restarting ({restart + 1} of {limit}): {where}",
            file=sys.stderr,
            flush=True,
        )
        _log_restart(out, restart + 1, ended.why)
    raise AssertionError("unreachable: the loop returns or raises")


def _attempt(cfg: RunConfig, nproc: int, stop_event, should_stop: Callable[[], bool]) -> dict | Crash:
    """One start of every rank; the trainer's result, or how it crashed."""
    import torch.multiprocessing as mp

    # The ranks meet through a file in this folder, not a TCP port: a port picked free here and bound later by
    # rank 0 can be taken in between by any other process on the machine (Slurm jobs, vLLM engines), and a
    # rank that reaches a stranger's listener fails in native code.
    folder = tempfile.mkdtemp(prefix="eagle-batch-train-")
    try:
        try:
            ranks = mp.start_processes(
                _rank_main, args=(nproc, cfg, folder, stop_event), nprocs=nproc, join=False, start_method="spawn"
            )
            while not ranks.join(timeout=_POLL_S):
                if not stop_event.is_set() and should_stop():
                    stop_event.set()
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            user_error = _user_error(Path(folder))
            if user_error is not None:
                raise user_error from None
            return _crash_of(e)
        result = Path(folder) / "result.json"
        return json.loads(result.read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _rank_main(rank: int, world: int, cfg: RunConfig, folder: str, stop_event) -> None:
    """A rank process: train, hand the result (rank 0) or a UserError back to the parent through `folder`."""
    faulthandler.enable()  # a native abort (CUDA, gloo, OpenMP) then prints each Python thread's stack
    environment.set_variables(environment.rank_environment(rank, world, os.path.join(folder, "rendezvous")))
    from eagle_batch.train.trainer import shutdown_distributed, train

    try:
        result = train(cfg, should_stop=stop_event.is_set)
    except UserError as e:
        write_atomic(Path(folder) / f"error-{rank:05d}.pickle", [_pickled(e)], fsync=False)
        sys.exit(_USER_ERROR_EXIT)
    finally:
        shutdown_distributed()
    if rank == 0:
        write_json_atomic(Path(folder) / "result.json", result, fsync=False)


def _pickled(e: UserError) -> bytes:
    try:
        data = pickle.dumps(e)
        pickle.loads(data)  # an exception whose __init__ takes other arguments does not load back
        return data
    except Exception:  # noqa: BLE001 - any pickling failure: the message, as a plain UserError
        plain = UserError(str(e))
        plain.exit_code = e.exit_code
        return pickle.dumps(plain)


def _user_error(folder: Path) -> UserError | None:
    files = sorted(folder.glob("error-*.pickle"))
    return pickle.loads(files[0].read_bytes()) if files else None


def _crash_of(e) -> Crash:
    import torch.multiprocessing as mp

    from eagle_batch.train.data import is_worker_death

    if isinstance(e, mp.ProcessExitedException):
        if e.signal_name:
            return Crash(f"rank {e.error_index} was killed by signal {e.signal_name}", True, e)
        return Crash(f"rank {e.error_index} exited with status {e.exit_code}", False, e)
    text = str(e)
    last = next((line for line in reversed(text.splitlines()) if line.strip()), text)
    # A data worker's death is restartable too; a sample it could not read names the input and is not.
    restartable = is_worker_death(text) or any(f in text for f in DEVICE_FAULTS)
    return Crash(f"rank {e.error_index} raised {last.strip()}", restartable, e)


def _with_time_left(cfg: RunConfig, started: float) -> RunConfig:
    if cfg.train.max_time_s <= 0:
        return cfg
    left = copy.deepcopy(cfg)
    left.train.max_time_s = max(1.0, cfg.train.max_time_s - (time.monotonic() - started))
    return left


def _checkpoint_note(out: Path) -> str:
    from eagle_batch.train.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(out)
    return f"its last checkpoint is {ckpt}" if ckpt else f"no checkpoint was written yet under {out}/checkpoints"


def _log_restart(out: Path, restart: int, why: str) -> None:
    """The restart in the draft's metrics.jsonl, beside the trainer's own events."""
    if out.is_dir():
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"event": "restart", "restart": restart, "why": why, "time": time.time()}) + "\n")

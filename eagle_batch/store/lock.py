"""The per-store writer lock: one writer per task store, enforced by `flock` on STORE/.lock.

flock locks die with the process, so a SIGKILLed writer never leaves a stale lock. The file's content names
the holder (host, pid, Slurm job, since) for the error a second writer gets.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from eagle_batch import environment

from .errors import StoreLockedError
from .format import LOCK_NAME


def holder_info() -> dict[str, Any]:
    sj = environment.slurm_job()
    job = f"{sj.task_job_id} (job id {sj.job_id})" if sj.array_job_id else sj.job_id
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job": job,
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class StoreLock:
    """Exclusive `flock` on STORE/.lock; the file's content names the holder (for the error message).

    flock locks die with the process, so a SIGKILLed writer never leaves a stale lock. On network file
    systems flock must be supported (Lustre: mount with `flock`; NFSv4 maps it to byte-range locks).
    """

    def __init__(self, store: Path):
        self.path = store / LOCK_NAME
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(self.fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            os.close(self.fd)
            who = (
                f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
                f"Slurm job {holder.get('slurm_job') or 'none'}, since {holder.get('since', '?')}"
            )
            raise StoreLockedError(
                f"{store} is being written by another process ({who}). Only one writer per store is "
                "allowed: wait for that task to finish, or cancel it (`scancel JOB` / kill the pid) and "
                "retry; the lock is released automatically when the holder exits."
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(holder_info()).encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            try:
                os.ftruncate(self.fd, 0)
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
                self.fd = -1

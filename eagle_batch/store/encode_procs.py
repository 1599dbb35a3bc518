"""Encode processes: compress chunks that lie in shared memory, each process with its own interpreter.

Why processes: a capture feeds ~4 GB/s of states into one driver process, whose threads (vLLM's, the
receiver, the writer, 30 compression and 8 IO threads) all retake one GIL after every C call. On an H200
host a thread waking from a 1 ms sleep waited ~1 ms on average for it, so the writer's bookkeeping,
not compression or the disk, bounded the capture (0.86 of plain even with codec none). Here a chunk is a
message of a few numbers: a process reads the rows where they already are (`shared.py`), writes the
encoded bytes into a buffer of the writer's arena and answers (size, crc32c of the rows, crc32c of the
encoded bytes). The writer's IO threads write shards from those buffers as before.

Processes are started with `python -m eagle_batch.store.encode_worker FD ...` (not multiprocessing's spawn,
which re-imports the caller's `__main__`, often vLLM and torch) over a socketpair; one exits when its
socket closes, so a killed writer leaves none behind.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from typing import Callable

from .spec import StoreError


class EncodeProcessError(StoreError):
    """An encode process failed or died; nothing after the last commit is claimed by the store."""


class _Job:
    __slots__ = ("fut", "finish", "worker")

    def __init__(self, fut: Future, finish: Callable, worker: int):
        self.fut = fut
        self.finish = finish
        self.worker = worker


class EncodeProcessPool:
    """`n` encode processes for one codec and item size; `submit` returns a Future of `finish(size, crc, data_crc)`."""

    def __init__(self, n: int, codec, itemsize: int, nice: int = 5, startup_timeout_s: float = 120.0):
        self.n = n
        self._conns: list[Connection] = []
        self._procs: list[subprocess.Popen] = []
        self._inflight: list[int] = []
        self._alive: list[bool] = []
        self._jobs: dict[int, _Job] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self.direct = False  # whether the processes' encoder calls the C compressor directly (encoder.py)
        args = [codec.name, str(codec.level), str(codec.blocksize), str(itemsize), str(nice)]
        # The package root on the children's path, wherever the parent found it (a checkout, a container).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
        try:
            for i in range(n):
                ours, theirs = socket.socketpair()
                try:
                    p = subprocess.Popen([sys.executable, "-m", "eagle_batch.store.encode_worker", str(theirs.fileno()),
                                          *args], pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
                finally:
                    theirs.close()
                self._procs.append(p)
                self._conns.append(Connection(ours.detach()))
                self._inflight.append(0)
                self._alive.append(True)
            self._wait_ready(startup_timeout_s)
        except BaseException:
            self.close()
            raise
        self._collector = threading.Thread(target=self._collect, name="store-encode-procs", daemon=True)
        self._collector.start()

    def _wait_ready(self, timeout_s: float) -> None:
        """Each process says hello once its encoder is built, so a broken environment fails here, by name."""
        waiting = dict(enumerate(self._conns))
        deadline = time.monotonic() + timeout_s
        while waiting:
            ready = wait(list(waiting.values()), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise EncodeProcessError(f"{len(waiting)} of {self.n} encode processes did not start within "
                                         f"{timeout_s:.0f} s")
            for c in ready:
                w = self._conns.index(c)
                try:
                    hello = c.recv()
                except (EOFError, OSError):
                    p = self._procs[w]
                    raise EncodeProcessError(f"encode process {p.pid} exited at start (code {p.wait()}); its "
                                             "error is above in the task's log") from None
                self.direct = hello[1]
                del waiting[w]

    def submit(self, src: tuple[str, int], nbytes: int, dst: tuple[str, int], cap: int,
               finish: Callable[[int, int, int], object]) -> Future:
        """Encode `nbytes` at `src` (path, offset) into `cap` bytes at `dst`. `finish(size, crc, data_crc)`
        runs on the collector thread and gives the Future's result; on failure it is called with the
        exception instead (finish(exc)) and the Future fails with it."""
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise EncodeProcessError("the encode processes are shut down")
            live = [i for i in range(self.n) if self._alive[i]]
            if not live:
                raise EncodeProcessError("every encode process has exited; see the task's log for why")
            w = min(live, key=self._inflight.__getitem__)
            job_id = next(self._ids)
            job = self._jobs[job_id] = _Job(fut, finish, w)
            self._inflight[w] += 1
            try:  # sent under the lock: one writer per connection at a time
                self._conns[w].send((job_id, src[0], src[1], nbytes, dst[0], dst[1], cap))
                return fut
            except OSError as e:
                del self._jobs[job_id]
                self._inflight[w] -= 1
                p = self._procs[w]
                err = EncodeProcessError(f"encode process {p.pid} is gone (exit code {p.poll()}; {e}); out of "
                                         "memory? (check the node's dmesg / the job's memory limit)")
        self._complete(job, exc=err)
        raise err

    def _complete(self, job: _Job, payload=None, exc: BaseException | None = None) -> None:
        try:
            if exc is None:
                job.fut.set_result(job.finish(*payload))
                return
        except BaseException as e:  # noqa: BLE001 - a failing finish fails its Future
            exc = e
        try:
            job.finish(exc)
        finally:
            job.fut.set_exception(exc)

    def _collect(self) -> None:
        while True:
            with self._lock:
                conns = [c for i, c in enumerate(self._conns) if self._alive[i]]
                if self._closed or not conns:
                    return
            for c in wait(conns, timeout=0.5):
                w = self._conns.index(c)
                try:
                    job_id, payload, err = c.recv()
                except (EOFError, OSError):
                    self._worker_died(w)
                    continue
                with self._lock:
                    job = self._jobs.pop(job_id)
                    self._inflight[w] -= 1
                self._complete(job, payload, None if err is None else EncodeProcessError(
                    f"encode process {self._procs[w].pid} failed: {err}"))

    def _worker_died(self, w: int) -> None:
        p = self._procs[w]
        try:
            code = p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        with self._lock:
            self._alive[w] = False
            lost = [(k, j) for k, j in self._jobs.items() if j.worker == w]
            for k, _ in lost:
                del self._jobs[k]
            closed = self._closed
        if closed:
            return
        err = EncodeProcessError(f"encode process {p.pid} exited (code {code}) with {len(lost)} chunks in hand; "
                                 "out of memory? (check the node's dmesg / the job's memory limit)")
        for _, job in lost:
            self._complete(job, exc=err)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for c in self._conns:
            try:
                c.close()  # the process sees EOF and exits
            except OSError:
                pass
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        with self._lock:
            jobs, self._jobs = list(self._jobs.values()), {}
        for job in jobs:
            self._complete(job, exc=EncodeProcessError("the encode processes were shut down"))

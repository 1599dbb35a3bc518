"""Worker -> driver transport for the native connector when the vLLM worker is another process (TP>1,
or VLLM_ENABLE_V1_MULTIPROCESSING=1).

A ring buffer in a shared-memory file (/dev/shm when it has room, else the temp dir) carries the state
bytes; a Unix socket carries one small record per request. Single producer (TP rank 0's connector),
single consumer (the driver's receiver thread):

- producer (`ShmProducer`, in the worker): `alloc_host(shape, dtype)` reserves the next bytes of the
  ring and returns a tensor over them. On CUDA the whole ring is page-locked once (cudaHostRegister),
  so the connector's `copy_(non_blocking=True)` on its side stream lands directly in shared memory:
  no staging copy, no host sync on the engine thread. `put_rows(...)` queues one record for the rows
  of several requests back to back (all requests an engine step finished: one allocation, one copy,
  one message per step, not per request); a sender thread waits for the copy's event and sends
  (per request: sample id, request id, token ids, row count, finite flag; offset, row shape, dtype).
- consumer (`ShmReceiver`, in the driver): reads records and hands the driver's sink one
  CapturedRequest per request whose states are a view of the ring (no copy). The store reads them in
  place and releases each request once it is encoded, in any order; a record is released with its
  last request, and the receiver advances the "consumed" byte count in the ring's header (the
  producer's free-space signal; one aligned int64 written by one side only) over the released prefix
  of records, so the producer never overwrites bytes still being read.

When the ring is full the producer waits (back-pressure on the engine): size it to absorb bursts
(`extract.shm_bytes`, default min(8 GiB, half of free /dev/shm)).
"""

from __future__ import annotations

import logging
import mmap
import os
import pickle
import queue
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from eagle_batch.store.loan import Loan

from .sink import CapturedRequest, Sink

log = logging.getLogger(__name__)

HEADER = 4096  # bytes reserved at the start of the file: [0:8] consumed counter (int64)
ALIGN = 512
_LEN = struct.Struct("!Q")

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "uint8": torch.uint8}


def _send(sock: socket.socket, obj: Any) -> None:
    b = pickle.dumps(obj, protocol=5)
    sock.sendall(_LEN.pack(len(b)) + b)


def _recv(f) -> Any:
    """The next record from a buffered reader over the socket (None at its end). Buffered: records queued in
    the socket cost one system call together, not two each (each drops and retakes the GIL)."""
    h = f.read(_LEN.size)
    if len(h) < _LEN.size:
        return None
    n = _LEN.unpack(h)[0]
    b = f.read(n)
    return None if len(b) < n else pickle.loads(b)


def default_ring_bytes() -> int:
    """extract.shm_bytes=0: min(8 GiB, half of the free /dev/shm), at least 256 MiB."""
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        free = 0
    return int(min(8 << 30, max(free // 2, 256 << 20)))


class ShmReceiver:
    """Driver side: owns the ring file and the socket; feeds `sink` from a thread."""

    def __init__(self, sink: Sink, ring_bytes: int | None = None):
        self.sink = sink
        self.size = int(ring_bytes or default_ring_bytes())
        base = (
            "/dev/shm"
            if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > self.size + HEADER
            else tempfile.gettempdir()
        )
        self.dir = tempfile.mkdtemp(prefix="eb-", dir=tempfile.gettempdir())  # short path for the socket
        fd, self.path = tempfile.mkstemp(prefix="eb-ring-", dir=base)
        os.ftruncate(fd, HEADER + self.size)
        self._mm = mmap.mmap(fd, HEADER + self.size)
        os.close(fd)
        self._consumed = np.frombuffer(self._mm, dtype=np.int64, count=1, offset=0)
        self._consumed[0] = 0
        self._data = np.frombuffer(self._mm, dtype=np.uint8, count=self.size, offset=HEADER)
        self.sock_path = os.path.join(self.dir, "s")
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(self.sock_path)
        self._srv.listen(4)
        self._cv = threading.Condition()
        self._unreleased: deque[list] = deque()  # [end, released] per record still in the ring, in ring order
        self._release_lock = threading.Lock()
        self.received = 0
        self.error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="eagle-batch-shm-recv", daemon=True)
        self._thread.start()

    def spec(self) -> dict:
        return {"path": self.path, "size": self.size, "socket": self.sock_path}

    def _run(self) -> None:
        try:
            while not self._closed:
                try:
                    conn, _ = self._srv.accept()
                except OSError:
                    return
                with conn, conn.makefile("rb", buffering=1 << 20) as f:
                    while True:
                        rec = _recv(f)
                        if rec is None:
                            break
                        self._handle(rec)
        except BaseException as e:  # noqa: BLE001 - surfaced by wait_for
            self.error = e
            log.error("shared-memory receiver failed: %s", e)
        finally:
            with self._cv:
                self._cv.notify_all()

    def _handle(self, rec) -> None:
        requests, start, shape, dtype, end = rec
        itemsize = _DTYPES[dtype].itemsize
        row_nbytes = int(np.prod(shape)) * itemsize
        # One ring entry per record: [end, requests not yet released]; the record's bytes are free once its
        # last request is released (in any order).
        entry = [end, len(requests)]
        with self._release_lock:
            self._unreleased.append(entry)

        def release_one(entry=entry):
            with self._release_lock:
                entry[1] -= 1
                while self._unreleased and self._unreleased[0][1] <= 0:
                    self._consumed[0] = self._unreleased.popleft()[0]  # the producer may reuse these bytes

        total = sum(r[3] for r in requests)
        block = (
            self._data[start : start + total * row_nbytes].view(np.uint16).reshape(total, *shape)
            if dtype == "bfloat16"
            else None
        )
        off, row0 = start, 0
        for i, (sample_id, req_id, token_ids, T, finite) in enumerate(requests):
            raw = self._data[off : off + T * row_nbytes]
            off += T * row_nbytes
            # Zero-copy view of the ring. Shaped by numpy: one torch call instead of two (each drops and
            # retakes the GIL).
            bits = None
            if dtype == "bfloat16":
                bits = raw.view(np.uint16).reshape(T, *shape)
                states = torch.from_numpy(bits).view(torch.bfloat16)
            else:
                states = torch.from_numpy(raw).view(_DTYPES[dtype]).view(T, *shape)
            flag = None if finite is None else bool(finite)
            release = Loan(release_one)  # counts once however often the sink calls it
            try:
                self.sink.put(
                    CapturedRequest(sample_id, req_id, token_ids, states, None, flag, release, bits, block, row0)
                )
                row0 += T
            except BaseException:
                # A sink that refused a request never releases it, nor sees the ones after it: do not wedge
                # the ring behind them.
                for _ in range(len(requests) - i):
                    release_one()
                raise
            finally:
                with self._cv:
                    self.received += 1
                    self._cv.notify_all()

    def wait_for(self, n_more: int, start: int | None = None, timeout_s: float = 600.0) -> None:
        """Block until `n_more` records arrived since `start` (a previous value of `received`)."""
        start = 0 if start is None else start
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self.received - start < n_more:
                if self.error is not None:
                    raise RuntimeError(f"shared-memory transport failed: {self.error}") from self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        f"only {self.received - start} of {n_more} captured samples arrived from the "
                        f"vLLM worker within {timeout_s:.0f} s (did TP rank 0 die? see its log)"
                    )
                self._cv.wait(min(left, 1.0))

    def close(self) -> None:
        self._closed = True
        try:
            self._srv.close()
        except OSError:
            pass
        for p in (self.path, self.sock_path):
            try:
                os.unlink(p)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


class ShmProducer(Sink):
    """Worker side (TP rank 0): allocates ring space for D2H copies and sends records in order."""

    def __init__(self, spec: dict):
        self.size = int(spec["size"])
        fd = os.open(spec["path"], os.O_RDWR)
        self._mm = mmap.mmap(fd, HEADER + self.size)
        os.close(fd)
        self._consumed = np.frombuffer(self._mm, dtype=np.int64, count=1, offset=0)
        self._data_t = torch.frombuffer(self._mm, dtype=torch.uint8, count=self.size, offset=HEADER)
        self._produced = 0
        self._registered = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(spec["socket"])
        self._q: queue.Queue = queue.Queue()
        self._pending: list[tuple[int, int]] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="eagle-batch-shm-send", daemon=True)
        self._thread.start()

    def _ensure_registered(self) -> None:
        if self._registered or not torch.cuda.is_available():
            return
        ptr = self._data_t.data_ptr()
        err = torch.cuda.cudart().cudaHostRegister(ptr, self.size, 0)
        if int(err) != 0:
            raise RuntimeError(
                f"cudaHostRegister of the {self.size >> 20} MiB shared ring failed ({err}); "
                "lower extract.shm_bytes, or with TP=1 set extract.engine_process=in-process"
            )
        self._registered = True

    @property
    def max_record_bytes(self) -> int:
        """A step's requests go in records of at most this size (one request may be bigger): several records
        fit the ring at once, so the producer can fill one while the store still reads another."""
        return self.size // 4

    def alloc_host(self, shape, dtype: torch.dtype, pin: bool) -> tuple[torch.Tensor, tuple[int, int]]:
        if self._error is not None:
            raise RuntimeError(f"shared-memory sender failed: {self._error}")
        if pin:
            self._ensure_registered()
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        span = -(-nbytes // ALIGN) * ALIGN
        if span > self.size:
            raise RuntimeError(
                f"one request needs {nbytes >> 20} MiB, more than the {self.size >> 20} MiB shared "
                "ring; raise extract.shm_bytes"
            )
        pos = self._produced % self.size
        if pos + span > self.size:  # do not wrap inside a record: skip to the ring's start
            self._produced += self.size - pos
            pos = 0
        end = self._produced + span
        t0 = None
        while end - int(self._consumed[0]) > self.size:
            if t0 is None:
                t0 = time.monotonic()
                log.warning("shared ring full (%d MiB): the writer is behind; the engine waits", self.size >> 20)
            time.sleep(0.001)
        self._produced = end
        view = self._data_t[pos : pos + nbytes].view(dtype).view(shape)
        return view, (pos, end)

    def put_rows(
        self,
        requests: list[tuple[str, str, Any, int]],
        rows: torch.Tensor,
        where: tuple[int, int],
        ready=None,
        finite_rows=None,
    ) -> None:
        """Queue one record: `rows` (from `alloc_host`, [sum T, ...]) holds the requests' rows back to back, in
        the order of `requests` = [(sample_id, req_id, token_ids, T)]. `ready()` blocks until the rows (and
        `finite_rows`, a bool tensor with one flag per row, or None) are valid."""
        self._q.put((requests, rows, where, ready, finite_rows))

    def put(self, item: CapturedRequest, where: tuple[int, int] | None = None) -> None:
        """One request whose states came from `alloc_host`."""
        fin = item.finite
        if fin is not None and not isinstance(fin, bool):
            fin = fin.reshape(-1)[:1].expand(len(item.states))
        self.put_rows(
            [(item.sample_id, item.req_id, item.token_ids, len(item.states))], item.states, where, item.ready, fin
        )

    def _run(self) -> None:
        try:
            while True:
                got = self._q.get()
                if got is None:
                    return
                requests, rows, (pos, end), ready, finite_rows = got
                if ready is not None:
                    ready()
                flags = None
                if finite_rows is not None:
                    flags = np.asarray(finite_rows.numpy() if isinstance(finite_rows, torch.Tensor) else finite_rows)
                meta, off = [], 0
                for sample_id, req_id, token_ids, T in requests:
                    fin = None if flags is None else bool(flags[off : off + T].all())
                    meta.append((sample_id, req_id, np.asarray(token_ids), int(T), fin))
                    off += T
                if off != len(rows):
                    raise RuntimeError(f"record of {len(rows)} rows announces {off} (requests {requests[:3]}...)")
                dtype = str(rows.dtype).replace("torch.", "")
                _send(self._sock, (meta, pos, tuple(rows.shape[1:]), dtype, end))
        except BaseException as e:  # noqa: BLE001
            self._error = e
            log.error("shared-memory sender failed: %s", e)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)
        try:
            self._sock.close()
        except OSError:
            pass

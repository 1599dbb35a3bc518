"""Worker -> driver transport for the native connector when the vLLM worker is another process (TP>1,
or VLLM_ENABLE_V1_MULTIPROCESSING=1).

A ring buffer in a shared-memory file (/dev/shm when it has room, else the temp dir) carries the state
bytes; a Unix socket carries one small record per request. Single producer (TP rank 0's connector),
single consumer (the driver's receiver thread):

- producer (`ShmProducer`, in the worker): `alloc_host(shape, dtype)` reserves the next bytes of the
  ring and returns a tensor over them. On CUDA the whole ring is page-locked once (cudaHostRegister),
  so the connector's `copy_(non_blocking=True)` on its side stream lands directly in shared memory:
  no staging copy, no host sync on the engine thread. `put(item)` queues the record; a sender thread
  waits for the copy's event and sends (sample id, request id, token ids, offset, shape, dtype).
- consumer (`ShmReceiver`, in the driver): reads records and hands the driver's sink a CapturedRequest
  whose states are a view of the ring (no copy). The store reads them in place and releases each
  record once it is encoded, in any order; the receiver advances the "consumed" byte count in the
  ring's header (the producer's free-space signal; one aligned int64 written by one side only) over
  the released prefix of records, so the producer never overwrites bytes still being read.

When the ring is full the producer waits (back-pressure on the engine): size it to absorb bursts
(`EAGLE_BATCH_SHM_BYTES`, default min(8 GiB, half of free /dev/shm)).
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import shutil
import socket
import struct
import tempfile
import threading
import time
import pickle
from collections import deque
from typing import Any

import numpy as np
import torch

from .sink import CapturedRequest, Sink

log = logging.getLogger(__name__)

HEADER = 4096          # bytes reserved at the start of the file: [0:8] consumed counter (int64)
ALIGN = 512
_LEN = struct.Struct("!Q")

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


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
    env = os.environ.get("EAGLE_BATCH_SHM_BYTES")
    if env:
        return int(env)
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
        base = "/dev/shm" if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > self.size + HEADER \
            else tempfile.gettempdir()
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
        sample_id, req_id, token_ids, start, nbytes, shape, dtype, end, finite = rec
        raw = self._data[start:start + nbytes]
        # Zero-copy view of the ring; released (in any order) once the store no longer reads it. Shaped by
        # numpy: one torch call instead of two (each drops and retakes the GIL).
        bits = None
        if dtype == "bfloat16":
            bits = raw.view(np.uint16).reshape(shape)
            states = torch.from_numpy(bits).view(torch.bfloat16)
        else:
            states = torch.from_numpy(raw).view(_DTYPES[dtype]).view(shape)

        entry = [end, False]
        with self._release_lock:
            self._unreleased.append(entry)

        def release(entry=entry):
            with self._release_lock:
                entry[1] = True
                while self._unreleased and self._unreleased[0][1]:
                    self._consumed[0] = self._unreleased.popleft()[0]  # the producer may reuse these bytes

        flag = None if finite is None else bool(finite)
        try:
            self.sink.put(CapturedRequest(sample_id, req_id, token_ids, states, None, flag, release, bits))
        except BaseException:
            release()  # a sink that refused the record never releases it: do not wedge the ring behind it
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
                    raise RuntimeError(f"only {self.received - start} of {n_more} captured samples arrived from the "
                                       f"vLLM worker within {timeout_s:.0f} s (did TP rank 0 die? see its log)")
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
            raise RuntimeError(f"cudaHostRegister of the {self.size >> 20} MiB shared ring failed ({err}); "
                               "lower EAGLE_BATCH_SHM_BYTES, or with TP=1 set extract.engine_process=in-process")
        self._registered = True

    def alloc_host(self, shape, dtype: torch.dtype, pin: bool) -> tuple[torch.Tensor, tuple[int, int]]:
        if self._error is not None:
            raise RuntimeError(f"shared-memory sender failed: {self._error}")
        if pin:
            self._ensure_registered()
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        span = -(-nbytes // ALIGN) * ALIGN
        if span > self.size:
            raise RuntimeError(f"one request needs {nbytes >> 20} MiB, more than the {self.size >> 20} MiB shared "
                               "ring; raise EAGLE_BATCH_SHM_BYTES")
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
        view = self._data_t[pos:pos + nbytes].view(dtype).view(shape)
        return view, (pos, end)

    def put(self, item: CapturedRequest, where: tuple[int, int] | None = None) -> None:
        self._q.put((item, where))

    def _run(self) -> None:
        try:
            while True:
                got = self._q.get()
                if got is None:
                    return
                item, (pos, end) = got
                if item.ready is not None:
                    item.ready()
                st = item.states
                dtype = str(st.dtype).replace("torch.", "")
                finite = None if item.finite is None else bool(item.finite.reshape(-1)[0])
                _send(self._sock, (item.sample_id, item.req_id, np.asarray(item.token_ids), pos,
                                   st.numel() * st.element_size(), tuple(st.shape), dtype, end, finite))
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

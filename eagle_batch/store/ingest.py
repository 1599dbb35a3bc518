"""Ingest: where a store writer's chunks are compressed and its shards written, and when append() waits.

Two kinds of threads work for a writer, so the producer (the capture's writer thread) only waits when the
disk is the bottleneck:
- compression threads (`store-encode`, nice +5 so that they take what the engine leaves) encode full
  hidden-state chunks, a few whole chunks per job (JOB_BYTES), straight from lent rows where possible;
- IO threads (`store-io-<array>`) encode the ~1 KiB token-id and mask chunks, then write each full shard
  once all its chunks are encoded (`<shard>.<uuid>.partial`, fsync, rename; directories at the commit).

Back-pressure, in the order append() meets it:
- compression slots (`2 * threads + 2` jobs queued or running) bound the buffers waiting for compression.
  With store.adaptive (blosc-zstd), a chunk that finds every slot taken while the disk keeps up (fewer than
  IO_QUEUE_RAW_LIMIT shards waiting for it) is kept raw, a memcpyed blosc frame, instead of waiting: the
  producer never waits on compression unless it would wait on the disk anyway, and the ratio reflects the
  CPU the node had spare. Once shards queue for the disk a raw chunk only adds bytes to the slowest stage,
  so append() waits for a slot instead;
- the disk's backlog: append() waits while IO_QUEUE_LIMIT shards with every chunk encoded wait for (or are
  in) their write, or IO_QUEUE_CAP shards are in flight at all.
A shard still waiting for its chunks' compression is the compression's backlog, not the disk's: counting
it would turn raw chunks off exactly when compression is the bottleneck and make append() wait at the
disk's queue instead of the slots (docs/decisions/0014 has the H200 measurements and their commands; 0015 the
thread counts).

A failed background write is kept in `failed`: the writer refuses every later commit, which could otherwise
claim data that is not on disk.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from pathlib import Path

import crc32c
import numpy as np

from .crc import crc32c_combine
from .durable import fsync_dir
from .errors import StoreError
from .format import ArrayLayout
from .loan import Loan
from .shard_codec import write_shard
from .stream import Encoded, RawChunk, Stream
from .trace import StoreTrace


def default_encode_threads() -> int:
    """All CPUs this process may use (a Slurm allocation, not the whole host) but two for the engine."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(2, min(32, cpus - 2))


def _lower_thread_priority() -> None:
    # On Linux, nice applies per thread: compression yields to the engine's threads when both want a core.
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 5)
    except (AttributeError, OSError):
        pass


class Ingest:
    """The compression and IO threads of one writer and the shard writes in flight (module docstring)."""

    IO_QUEUE_LIMIT = 8  # shards waiting for the disk before append() waits for it
    IO_QUEUE_CAP = 24  # shards in flight (also those waiting for compression) before append() waits
    IO_QUEUE_RAW_LIMIT = 4  # store.adaptive keeps chunks raw only while fewer shards wait for the disk
    JOB_BYTES = 16 << 20  # the most lent rows one compression job takes (whole chunks, at least one)

    def __init__(
        self,
        path: Path,
        layouts: dict[str, ArrayLayout],
        tables: dict[str, dict[int, dict]],
        *,
        fsync: bool,
        adaptive: bool,
        entropy_only: bool,
        trace: StoreTrace,
        threads: int | None = None,
        io_threads: int | None = None,
    ):
        self.path = path
        self.fsync = fsync
        self.trace = trace
        self.tables = tables  # shard entries by array and index, filled in as shard writes finish
        # Compression of bf16 states is the CPU-heavy stage: by default every CPU of the allocation but two
        # for the engine (store.encode_threads overrides it).
        n_threads = threads or default_encode_threads()
        self.encode_threads = n_threads
        self._encode_pool = ThreadPoolExecutor(
            n_threads, thread_name_prefix="store-encode", initializer=_lower_thread_priority
        )
        # hidden_states shards are written (and fsynced) by as many threads as shard writes may be queued, so
        # none waits for a thread: one thread's writes into the page cache fall behind a fast GPU node. Order
        # between shards does not matter: each is its own file, and a commit waits for all of them.
        self.io_threads = io_threads or self.IO_QUEUE_LIMIT
        self._io_pools = {
            n: ThreadPoolExecutor(self.io_threads if n == "hidden_states" else 1, thread_name_prefix=f"store-io-{n}")
            for n in layouts
        }
        # Seconds append() spent waiting: for a compression slot (adaptive off, or the disk behind) and for
        # shard writes.
        self.stall_s = {"encode": 0.0, "io": 0.0}
        self._dirty_dirs: set[Path] = set()  # directories whose new entries need an fsync before the record
        # Compression jobs queued or running (a job: one chunk buffer of ours, or up to JOB_BYTES of lent rows):
        # bounds the buffers waiting for compression, so append() blocks instead of growing memory.
        self._encode_slots = threading.Semaphore(2 * n_threads + 2)
        self._pending_io: list[Future] = []
        self._io_writing = 0  # full shards encoded, queued for or in their write (see io_backlog)
        self._io_writing_lock = threading.Lock()
        self.failed: BaseException | None = None
        self.streams = {name: Stream(lay, self, adaptive, entropy_only) for name, lay in layouts.items()}

    # ----- compression -----

    def submit_encode(self, st: Stream, chunks: list[np.ndarray], loan: Loan | None) -> list:
        """One entry per chunk for the stream's `chunks`. `loan`: `chunks` are the caller's memory (else a single
        one of the stream's buffers, recycled after use)."""
        if st.layout.name != "hidden_states":
            # Token ids and masks: ~1 KiB chunks, kept as they are and encoded by their shard's IO job: a job
            # each on the compression pool (submit, wake-up, future, callback) costs more interpreter time than
            # the encoding itself, and two of three chunks are these.
            return chunks
        # Waiting for a slot, the disk is asked again and again: its queue drains while compression may stay
        # stuck, and then a raw chunk is the faster way on.
        t0 = None
        while not self._encode_slots.acquire(blocking=False):
            if st.raw_header is not None and self.io_backlog() < self.IO_QUEUE_RAW_LIMIT:
                if t0 is not None:
                    self.stall_s["encode"] += time.perf_counter() - t0
                return self._keep_raw(st, chunks, loan)  # every compression slot busy, the disk keeps up
            t0 = t0 or time.perf_counter()
            if self._encode_slots.acquire(timeout=0.005):
                break
        if t0 is not None:
            self.stall_s["encode"] += time.perf_counter() - t0
        st.chunks_compressed += len(chunks)
        if loan is not None:
            loan.hold()
        fut = self._encode_pool.submit(st.encode_job, chunks, loan)
        fut.add_done_callback(lambda _f: self._encode_slots.release())
        return [Encoded(fut, i) for i in range(len(chunks))]

    def _keep_raw(self, st: Stream, chunks: list[np.ndarray], loan: Loan | None) -> list:
        raws = []
        for chunk in chunks:
            st.chunks_raw += 1
            raw = RawChunk(st.raw_header, chunk)
            if loan is not None:  # a raw chunk lives until its shard is written, a loan must not: copy
                loan.hold()
                raw.detached = self._io_pools[st.layout.name].submit(raw.detach, st.new_buf(), loan)
            raws.append(raw)
        return raws

    def io_backlog(self) -> int:
        """Shard writes the disk is behind on: every chunk encoded, waiting for or inside the write (a shard
        waiting for its chunks' compression is the compression's backlog; module docstring)."""
        return self._io_writing

    # ----- shard writes -----

    def submit_shard(self, st: Stream, k: int, chunks: list, tokens: int, restored: int, restored_crc: int) -> None:
        """Write full shard k of `st` once its chunks are encoded; first wait while the disk is behind."""
        self._harvest_io()
        while self._pending_io and (
            self.io_backlog() >= self.IO_QUEUE_LIMIT or len(self._pending_io) >= self.IO_QUEUE_CAP
        ):
            t0 = time.perf_counter()
            try:
                self._record_shard(*self._pending_io.pop(0).result())
            except BaseException as e:  # a failed background write: no later commit may claim it
                self.failed = e
                raise
            finally:
                self.stall_s["io"] += time.perf_counter() - t0
        self._pending_io.append(
            self._write_when_encoded(
                st,
                [c.fut for c in chunks if isinstance(c, Encoded)],
                (st.layout, k, chunks, tokens, restored, restored_crc, None, True, st),
            )
        )

    def _write_when_encoded(self, st: Stream, encodes: list[Future], job_args: tuple) -> Future:
        """The shard write, handed to an IO thread only once its chunks are encoded: a write waiting for
        compression on an IO thread would keep ready shards (raw chunks) from the disk behind it until the
        list hit IO_QUEUE_CAP and append() waited. The returned future is the write's; `_io_writing` counts
        it from ready to written (see io_backlog)."""
        pool = self._io_pools[st.layout.name]
        shard = Future()
        left = [len(set(encodes))]
        lock = threading.Lock()

        def written(fut: Future) -> None:
            with self._io_writing_lock:
                self._io_writing -= 1
            try:
                if fut.cancelled() or fut.exception() is not None:
                    shard.set_exception(
                        fut.exception()
                        if not fut.cancelled()
                        else StoreError(f"shard {job_args[1]} of {job_args[0].name}: write cancelled")
                    )
                else:
                    shard.set_result(fut.result())
            except InvalidStateError:  # cancelled by close(): nobody waits for it
                pass

        def encoded(_f: Future | None = None) -> None:
            with lock:
                left[0] -= 1
                if left[0] > 0:
                    return
            if shard.cancelled():  # close() came first: no write
                return
            with self._io_writing_lock:
                self._io_writing += 1
            try:
                pool.submit(self._write_shard_job, *job_args).add_done_callback(written)
            except BaseException as e:  # noqa: BLE001 - the pool is shut down (close() after a failure)
                with self._io_writing_lock:
                    self._io_writing -= 1
                with contextlib.suppress(InvalidStateError):  # cancelled by close()
                    shard.set_exception(e)

        if not encodes:
            left[0] = 1
            encoded()
        for fut in set(encodes):
            fut.add_done_callback(encoded)  # runs at once if already done
        return shard

    def _harvest_io(self) -> None:
        """Record every finished shard write without waiting (any order: each fills its own table entry)."""
        keep = []
        for fut in self._pending_io:
            if not fut.done():
                keep.append(fut)
                continue
            try:
                self._record_shard(*fut.result())
            except BaseException as e:  # a failed background write: no later commit may claim it
                self.failed = e
                raise
        self._pending_io = keep

    def _record_shard(self, name: str, info: dict) -> None:
        # Tables feed the record only at the next commit; a tail rewrite replaces the older entry.
        self.tables[name][info["index"]] = info

    def _write_shard_job(
        self,
        lay: ArrayLayout,
        k: int,
        chunks: list,
        tokens: int,
        restored: int,
        restored_crc: int,
        tail: tuple[bytes, int, int] | None,
        defer_dir_sync: bool,
        recycle_to: Stream | None = None,
    ) -> tuple[str, dict]:
        """IO thread: write shard k from `chunks` (+ the padded `tail` chunk); its raw crc32c is the restored
        prefix's crc combined with each later chunk's, in row order."""
        t0 = self.trace.stamp()
        chunk_nbytes = lay.chunk_tokens * lay.row_nbytes
        pieces: list = []
        piece_crcs: list = []  # crc32c of each piece as written, where known without another pass
        raw_crc = restored_crc
        for i, c in enumerate(chunks):
            if isinstance(c, Encoded):
                data, crc, data_crc, _ = c.result()
            elif isinstance(c, np.ndarray):  # a small array's chunk, encoded here
                data, crc, data_crc = self.streams[lay.name].encode(c), crc32c.crc32c(c), None
            elif isinstance(c, RawChunk):  # header + raw rows: the frame's crc from the rows' crc
                data, crc = c.parts(), c.crc()
                data_crc = crc32c_combine(crc32c.crc32c(c.header), crc, chunk_nbytes)
            else:
                data, crc, data_crc = c, None, None
            pieces.append(data)
            piece_crcs.append(data_crc)
            if i >= restored:
                raw_crc = crc32c_combine(raw_crc, crc, chunk_nbytes)
        if tail is not None:
            pieces.append(tail[0])
            piece_crcs.append(None)
            raw_crc = crc32c_combine(raw_crc, tail[1], tail[2])
        ready = self.trace.stamp()
        info = self._write_shard(lay, k, pieces, tokens, raw_crc, defer_dir_sync, piece_crcs)
        self.trace.event(
            "shard", t0, array=lay.name, shard=k, ready=ready, full=recycle_to is not None, nbytes=info.get("nbytes")
        )
        if recycle_to is not None:  # a full shard: its raw chunk and encoded chunk buffers are free again
            recycle_to.recycle(chunks)
        return lay.name, info

    def _write_shard(
        self,
        lay: ArrayLayout,
        k: int,
        pieces: list,
        tokens: int,
        raw_crc: int,
        defer_dir_sync: bool = False,
        piece_crcs: list | None = None,
    ) -> dict:
        dirty = self._dirty_dirs if defer_dir_sync else None
        return write_shard(
            self.path, lay, k, pieces, tokens, raw_crc, fsync=self.fsync, dirty_dirs=dirty, piece_crcs=piece_crcs
        )

    # ----- commit and close -----

    def write_tails_and_wait(self) -> None:
        """Write each array's partly filled tail shard (its committed rows unchanged), wait for every shard
        write, record them in the tables, and fsync the directories that gained entries: after this, the
        tables describe files that are on disk and a record may name them."""
        for st in self.streams.values():
            if st.fill:
                self._pending_io.append(
                    self._io_pools[st.layout.name].submit(
                        self._write_shard_job,
                        st.layout,
                        st.shard,
                        list(st.chunks),
                        st.fill,
                        st.restored,
                        st.restored_crc,
                        st.tail(),
                        True,
                    )
                )
        pending, self._pending_io = self._pending_io, []
        for fut in pending:
            self._record_shard(*fut.result())
        if self.fsync:
            dirs, self._dirty_dirs = self._dirty_dirs, set()
            for d in sorted(dirs, key=lambda d: -len(d.parts)):
                fsync_dir(d)

    def close(self) -> None:
        """Cancel shard writes not started, stop the threads (waiting for running jobs)."""
        for fut in self._pending_io:
            fut.cancel()
        self._encode_pool.shutdown(wait=True, cancel_futures=True)
        for pool in self._io_pools.values():
            pool.shutdown(wait=True, cancel_futures=True)

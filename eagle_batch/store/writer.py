"""TaskStoreWriter: append samples to one task store with crash-safe commits.

    with TaskStoreWriter.open(path, spec, cfg.store) as w:
        for s in samples:
            if s.sample_id in w.committed_sample_ids: continue
            w.append(s.sample_id, s.input_ids, s.loss_mask, hidden_states)  # torch bf16 [T, L, H]
            if time_to_commit: w.commit()
        w.finalize()

Commit protocol (one writer per store, enforced by a flock):
1. append() cuts rows into inner chunks; full hidden_states chunks are compressed (and checksummed) on a
   thread pool, token-id and mask chunks (~1 KiB) by their shard's IO job, and full shards are written by
   IO threads (`<shard>.<uuid>.partial`, fsync, rename, fsync dir), so the producer only waits when it
   runs more than a few shards ahead of the disk. Rows are copied into a chunk buffer only where a chunk
   spans two samples: with `on_release` (the capture path) a chunk that lies inside one sample is
   compressed straight from the caller's memory, which is handed back once the last such chunk is encoded;
   the shard's raw crc32c is combined from the chunk crcs. With `store.adaptive` (blosc-zstd), a chunk
   that finds every compression slot taken while the disk keeps up (fewer than IO_QUEUE_RAW_LIMIT shards
   with all their chunks encoded waiting for the disk) is kept as an uncompressed blosc frame (16-byte header + the rows): the producer does
   not wait on compression unless it waits on the disk anyway, and the ratio reflects the CPU the node had
   spare.
2. `commit()` also writes the partially filled tail shard of each array (its already committed prefix
   is byte-identical), waits for every write, then atomically replaces `progress.json` (the committed
   record: samples, lengths, ids, per-shard size, crc32c of the file and of the raw rows). Only then
   are the `zarr.json` shapes advanced, so an array's shape never covers unwritten data.
3. `open()` of an existing store drops everything the record does not cover: `*.partial` files, shards
   past the record, and a tail shard rewritten by an interrupted commit (restored to its committed
   prefix after checking the prefix's raw crc32c).
4. `finalize()` writes `offsets` and `sample_ids`, consolidates metadata, then the `complete` marker.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from .blosc_frame import memcpyed_header
from .crc import crc32c_combine
from .encoder import ChunkEncoder
from .format import (
    BF16,
    COMPLETE_NAME,
    EMPTY,
    FORMAT_NAME,
    FORMAT_VERSION,
    PARTIAL_SUFFIX,
    PROGRESS_NAME,
    TOKEN_ARRAYS,
    ArrayLayout,
    Codec,
    ShardError,
    decode_index,
    encode_index,
    fsync_dir,
    make_decoder,
    makedirs_durable,
    write_atomic,
    write_json_atomic,
)
from .spec import StoreCorruptError, StoreError, StoreLock, StoreMismatchError, StoreSpec
from .trace import StoreTrace


def hidden_states_to_uint16(hidden_states: Any) -> np.ndarray:
    """torch bf16 (any device) / numpy bf16 / numpy uint16 -> numpy uint16 bits, zero-copy when possible."""
    # Check the type by module name so numpy-only writers never pay torch's import time.
    if type(hidden_states).__module__.startswith("torch"):
        import torch

        if hidden_states.dtype != torch.bfloat16:
            raise TypeError(
                f"hidden_states must be torch.bfloat16, got {hidden_states.dtype}; the store keeps "
                "the model's bf16 states bit-exactly and never converts."
            )
        # Each torch call drops and retakes the GIL, which the capture's many store threads contend for:
        # a CPU, contiguous tensor without grad (the capture's case) takes two.
        t = hidden_states
        if t.requires_grad:
            t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        return t.view(torch.uint16).numpy()
    a = np.asarray(hidden_states)
    if a.dtype == BF16:
        return a.view(np.uint16)
    if a.dtype == np.uint16:
        return a
    raise TypeError(f"hidden_states must be torch.bfloat16 or numpy uint16/bfloat16 bits, got {a.dtype}.")


CHUNK_TARGET_BYTES = 4 << 20


def auto_chunk_tokens(row_nbytes: int, shard_tokens: int) -> int:
    """store.chunk_tokens=0: the largest power of two <= 4 MiB of hidden-state rows that divides
    shard_tokens, within 16..1024 tokens (1024 keeps random reads of small models' samples cheap)."""
    want = max(16, min(1024, CHUNK_TARGET_BYTES // max(1, row_nbytes)))
    t = 1 << (int(want).bit_length() - 1)
    while t > 1 and shard_tokens % t:
        t >>= 1
    return t


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


def _as_1d(name: str, x: Any, dtype: np.dtype) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D [T], got shape {a.shape}")
    if a.dtype != dtype:
        if a.size and (a.min() < np.iinfo(dtype).min or a.max() > np.iinfo(dtype).max):
            raise ValueError(f"{name} has values outside {dtype} ({a.min()}..{a.max()})")
        a = a.astype(dtype)
    return np.ascontiguousarray(a)


class _RawChunk:
    """A full chunk kept uncompressed: a blosc memcpyed-frame header and the chunk buffer itself.

    The buffer goes back to its stream's free list once its full shard is on disk (not after a tail
    write: the same chunk is written again when the shard fills). A chunk of lent rows starts as a view
    of them; an IO thread copies it into a buffer of ours (`detached`) and ends the loan, so a loan never
    waits for its shard to fill. IO jobs run in submission order, so a shard job waiting on `detached`
    waits for a copy that is already running."""

    __slots__ = ("header", "buf", "_crc", "detached")

    def __init__(self, header: bytes, buf: np.ndarray):
        self.header = header
        self.buf = buf
        self._crc: int | None = None
        self.detached: Future | None = None

    def parts(self) -> tuple:
        if self.detached is not None:
            self.detached.result()
        return (self.header, self.buf)

    def crc(self) -> int:
        """crc32c of the raw rows, computed by the IO thread that first writes the chunk."""
        if self._crc is None:
            self._crc = crc32c.crc32c(self.parts()[1])
        return self._crc

    def detach(self, own: np.ndarray, loan: "_Loan") -> None:
        np.copyto(own, self.buf)
        self.buf = own
        loan.drop()


class _Loan:
    """Caller memory that append() reads in place; `release` runs once, when the last reader is done.

    append() itself holds it until it returns; each chunk encoded straight from it holds it until its
    compression thread finished (never longer: a chunk kept raw is copied instead, so a loan never waits
    for a shard to fill, i.e. for more input)."""

    __slots__ = ("_n", "_lock", "_release")

    def __init__(self, release: Callable[[], None]):
        self._n = 1
        self._lock = threading.Lock()
        self._release = release

    def hold(self) -> None:
        with self._lock:
            self._n += 1

    def drop(self) -> None:
        with self._lock:
            self._n -= 1
            last = self._n == 0
        if last:
            self._release()


class _Encoded:
    """Chunk `i` of a compression job: the job's Future gives one (encoded bytes, raw crc32c, encoded crc32c,
    buffer of ours or None) per chunk."""

    __slots__ = ("fut", "i")

    def __init__(self, fut: Future, i: int):
        self.fut = fut
        self.i = i

    def result(self) -> tuple:
        return self.fut.result()[self.i]


def _blosc_raw_header(codec: Codec, chunk_shape: tuple, dtype: np.dtype) -> bytes | None:
    """The header of a memcpyed blosc frame of one full chunk (None: not blosc, or not that frame layout, so
    always compress)."""
    if codec.name != "blosc-zstd":
        return None
    return memcpyed_header(int(np.prod(chunk_shape)) * dtype.itemsize, dtype.itemsize, codec.blocksize)


class _Stream:
    """Rows of one token array on their way into shard files."""

    def __init__(self, layout: ArrayLayout, writer: "TaskStoreWriter"):
        self.layout = layout
        self.w = writer
        self.encoder = ChunkEncoder(
            layout.codec, layout.np_dtype.itemsize, entropy_only=layout.name == "hidden_states" and writer.entropy_only
        )
        self.raw_header = (
            _blosc_raw_header(layout.codec, (layout.chunk_tokens, *layout.row_shape), layout.np_dtype)
            if writer.adaptive
            else None
        )
        self.chunks_compressed = 0
        self.chunks_raw = 0
        self.shard = 0  # index of the shard being filled
        self.fill = 0  # rows in that shard
        # Its full inner chunks: being encoded (`_Encoded`), kept raw, rows to be encoded by the shard's IO job
        # (ndarray: token ids and masks), or restored from disk (bytes; the first `restored` entries, whose rows'
        # crc32c is `restored_crc`).
        self.chunks: list[_Encoded | bytes | _RawChunk | np.ndarray] = []
        self.restored = 0
        self.restored_crc = 0
        # Chunk buffers are recycled: fresh multi-MB allocations page-fault on every first touch, which
        # measured 3x slower than copying into a reused buffer (2-core VM).
        self.free: list[np.ndarray] = []
        # Encoded chunks live in buffers of ours too (see encoder.py for why), reused once their full shard
        # is written.
        self.out_free: list[np.ndarray] = []
        self._out_nbytes = self.encoder.bound(layout.chunk_tokens * layout.row_nbytes)
        self.buf = self._new_buf()
        self.buf_fill = 0

    def _new_buf(self) -> np.ndarray:
        try:
            return self.free.pop()  # atomic; IO threads take buffers too (raw chunks of lent rows)
        except IndexError:
            pass
        return np.empty((self.layout.chunk_tokens, *self.layout.row_shape), self.layout.np_dtype)

    def encode(self, chunk: np.ndarray) -> bytes:
        return self.encoder.encode(chunk, None)

    def encode_job(self, chunks: list[np.ndarray], loan: _Loan | None) -> list[tuple]:
        """Runs on a compression thread: per chunk (encoded bytes, crc32c of the raw rows, crc32c of the encoded
        bytes, the buffer of ours holding them or None)."""
        t0 = self.w.trace.stamp()
        results: list[tuple] = []
        try:
            for chunk in chunks:
                out = None
                if self.encoder.direct:
                    try:
                        out = self.out_free.pop()  # atomic
                    except IndexError:
                        out = np.empty(self._out_nbytes, np.uint8)
                try:
                    data = self.encoder.encode(chunk, out)
                except BaseException:
                    if out is not None:
                        self.out_free.append(out)
                    raise
                crc = crc32c.crc32c(chunk)
                # codec none: the encoded bytes are the rows, one checksum pass serves both
                results.append((data, crc, crc if self.encoder.identity else crc32c.crc32c(data), out))
            self.w.trace.event(
                "encode",
                t0,
                array=self.layout.name,
                nbytes=sum(c.nbytes for c in chunks),
                encoded=sum(len(r[0]) for r in results),
                chunks=len(chunks),
            )
            return results
        except BaseException:
            self.out_free.extend(r[3] for r in results if r[3] is not None)
            raise
        finally:
            if loan is None:
                self.free.extend(chunks)  # our chunk buffers (list.extend is atomic); reuse them
            else:
                loan.drop()

    def push(self, rows: np.ndarray, loan: _Loan | None = None) -> None:
        lay = self.layout
        C = lay.chunk_tokens
        pos = 0
        while pos < len(rows):
            if loan is not None and self.buf_fill == 0 and len(rows) - pos >= C:
                # Whole chunks inside the caller's rows, compressed in place (no copy on this thread), a few per
                # job: each job costs interpreter time on several threads whatever its size. Never past the
                # shard's end (a shard is submitted when full) nor more than JOB_BYTES (one thread per job).
                k = min(
                    (len(rows) - pos) // C,
                    (lay.shard_tokens - self.fill) // C,
                    max(1, self.w.JOB_BYTES // (C * lay.row_nbytes)),
                )
                entries = self.w._submit_encode(self, [rows[pos + i * C : pos + (i + 1) * C] for i in range(k)], loan)
                for entry in entries:
                    self._add_chunk(entry, C)
                pos += k * C
                continue
            n = min(C - self.buf_fill, len(rows) - pos)
            self.buf[self.buf_fill : self.buf_fill + n] = rows[pos : pos + n]
            self.buf_fill += n
            pos += n
            if self.buf_fill < C:
                self.fill += n
                continue
            chunk, self.buf, self.buf_fill = self.buf, self._new_buf(), 0
            self._add_chunk(self.w._submit_encode(self, [chunk], None)[0], n)

    def _add_chunk(self, entry: _Encoded | _RawChunk | np.ndarray, new_rows: int) -> None:
        """A full chunk whose last `new_rows` rows were not yet counted in `fill`."""
        self.chunks.append(entry)
        self.fill += new_rows
        if self.fill == self.layout.shard_tokens:
            self.w._submit_shard(self, self.shard, list(self.chunks), self.fill, self.restored, self.restored_crc)
            self.shard += 1
            self.fill = 0
            self.chunks = []
            self.restored = self.restored_crc = 0

    def tail(self) -> tuple[bytes, int, int] | None:
        """The partially filled last chunk, zero-padded (the array's fill value): (encoded, raw crc, raw bytes)."""
        if not self.buf_fill:
            return None
        rows = self.buf[: self.buf_fill]
        padded = np.zeros_like(self.buf)
        padded[: self.buf_fill] = rows
        return self.encode(padded), crc32c.crc32c(rows), rows.nbytes


class TaskStoreWriter:
    """The single writer of one task store. See the module docstring for the commit protocol."""

    IO_QUEUE_LIMIT = 8  # shards waiting for the disk before append() waits for it
    IO_QUEUE_CAP = 24  # shards in flight (also those waiting for compression) before append() waits
    IO_QUEUE_RAW_LIMIT = 4  # store.adaptive keeps chunks raw only while fewer shards wait for the disk
    JOB_BYTES = 16 << 20  # the most lent rows one compression job takes (whole chunks, at least one)

    def __init__(self) -> None:  # use TaskStoreWriter.open()
        raise TypeError("use TaskStoreWriter.open(path, spec, store_cfg)")

    # ----- opening / recovery -----

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        spec: StoreSpec,
        store_cfg: Any = None,
        *,
        threads: int | None = None,
        repair: bool = False,
        on_commit: Callable[[int, int], None] | None = None,
    ) -> "TaskStoreWriter":
        """Open (creating or recovering) the store at `path` for appending.

        `store_cfg`: a `StoreConfig` (codec, level, blocksize, chunk_tokens, shard_tokens, fsync); an
        existing store keeps its own layout and codec. `repair=True` truncates the committed record to
        the last sample before the first damaged shard instead of raising StoreCorruptError.
        `on_commit(num_samples, num_tokens)` is called with the committed record's totals once the store
        is open (what an earlier writer committed) and after every commit that added samples, from the
        thread that called open()/commit(): how a task reports progress, whatever way it appends.
        """
        from eagle_batch.config import StoreConfig

        self = object.__new__(cls)
        self.path = Path(path)
        self.spec = spec
        self.cfg = store_cfg if store_cfg is not None else StoreConfig()
        self.fsync = bool(getattr(self.cfg, "fsync", True))
        self.adaptive = bool(getattr(self.cfg, "adaptive", False))
        self.entropy_only = bool(getattr(self.cfg, "entropy_only", StoreConfig.entropy_only))
        self.trace = StoreTrace.from_env()
        self._closed = False
        self._broken: BaseException | None = None
        self._lock = None
        makedirs_durable(self.path, self.fsync)
        self._lock = StoreLock(self.path)
        try:
            self._init_state(threads, repair)
        except BaseException:
            self._lock.release()
            raise
        self._on_commit = on_commit
        self._report_commit()
        return self

    def _report_commit(self) -> None:
        if self._on_commit is not None:
            self._on_commit(int(self.record["num_samples"]), int(self.record["num_tokens"]))

    def _init_state(self, threads: int | None, repair: bool) -> None:
        progress = self.path / PROGRESS_NAME
        if progress.is_file():
            self._load_existing(repair)
        else:
            self._create()
        # Encode threads: blosc-zstd-1 on real bf16 states does only 0.26 GB/s per core on an H200 host's
        # Xeon, so a fast GPU node needs most of its cores; they run at a lower priority (nice +5) so they
        # take what the engine leaves. EAGLE_BATCH_STORE_THREADS overrides the default.
        n_threads = threads or int(os.environ.get("EAGLE_BATCH_STORE_THREADS", 0)) or default_encode_threads()
        self.encode_threads = n_threads
        self._encode_pool = ThreadPoolExecutor(
            n_threads, thread_name_prefix="store-encode", initializer=_lower_thread_priority
        )
        # IO threads: a single thread's writes into the page cache ran at ~1 GB/s on an H200 host, a quarter
        # of what the node produces, so hidden_states shards are written (and fsynced) by several: as many
        # as shard writes may be queued, so none waits for a thread (4 threads for 8 queued shards left a
        # 1B-model capture 12% slower on an H200 node). Order between shards does not matter: each is its own
        # file, and a commit waits for all of them.
        self.io_threads = int(os.environ.get("EAGLE_BATCH_STORE_IO_THREADS", 0)) or self.IO_QUEUE_LIMIT
        self._io_pools = {
            n: ThreadPoolExecutor(self.io_threads if n == "hidden_states" else 1, thread_name_prefix=f"store-io-{n}")
            for n in TOKEN_ARRAYS
        }
        # Seconds append() spent waiting: for a compression slot (adaptive off, or the disk behind) and for
        # shard writes.
        self.stall_s = {"encode": 0.0, "io": 0.0}
        self._dirty_dirs: set[Path] = set()  # directories whose new entries need an fsync before the record
        # Compression jobs queued or running (a job: one chunk buffer of ours, or up to JOB_BYTES of lent rows):
        # bounds the buffers waiting for compression, so append() blocks instead of growing memory.
        self._encode_slots = threading.Semaphore(2 * n_threads + 2)
        self._pending_io: list[Future] = []
        self._io_writing = 0  # full shards encoded, queued for or in their write (see _io_backlog)
        self._io_writing_lock = threading.Lock()
        self._streams = {name: _Stream(self.layouts[name], self) for name in TOKEN_ARRAYS}
        for _name, st in self._streams.items():
            self._restore_tail(st)
        self._complete = (self.path / COMPLETE_NAME).is_file()

    def _chunk_tokens(self) -> int:
        c = self.cfg
        return c.chunk_tokens or auto_chunk_tokens(self.spec.num_layers * self.spec.hidden_size * 2, c.shard_tokens)

    def _make_layouts(self, chunk_tokens: int, shard_tokens: int, codec: Codec) -> dict[str, ArrayLayout]:
        rows = {"hidden_states": (self.spec.num_layers, self.spec.hidden_size), "input_ids": (), "loss_mask": ()}
        return {n: ArrayLayout(n, rows[n], chunk_tokens, shard_tokens, codec) for n in TOKEN_ARRAYS}

    def _create(self) -> None:
        c = self.cfg
        chunk = self._chunk_tokens()
        if chunk <= 0 or c.shard_tokens <= 0 or c.shard_tokens % chunk:
            raise ValueError(
                f"store.shard_tokens={c.shard_tokens} must be a positive multiple of "
                f"store.chunk_tokens={c.chunk_tokens}; fix the store section of the config."
            )
        self.layouts = self._make_layouts(chunk, c.shard_tokens, Codec(c.codec, c.level, c.blocksize))
        # A half-created store (killed before progress.json existed) holds nothing committed: start over.
        ours = {".lock", "zarr.json", *TOKEN_ARRAYS}
        children = list(self.path.iterdir())
        foreign = [c.name for c in children if c.name not in ours and not c.name.endswith(PARTIAL_SUFFIX)]
        if foreign:
            raise StoreError(
                f"{self.path} is not empty and not an eagle-batch store (no {PROGRESS_NAME}; found "
                f"{', '.join(sorted(foreign)[:5])}); choose an empty or new path for the task store."
            )
        for child in children:
            if child.name != ".lock":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        attrs = {"eagle_batch": {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **self.spec.attributes()}}
        write_json_atomic(
            self.path / "zarr.json", {"zarr_format": 3, "node_type": "group", "attributes": attrs}, self.fsync
        )
        for name, lay in self.layouts.items():
            makedirs_durable(self.path / name, self.fsync)
            write_json_atomic(self.path / name / "zarr.json", lay.zarr_json(0), self.fsync)
        self.record = self._empty_record()
        write_json_atomic(self.path / PROGRESS_NAME, self.record, self.fsync)  # last: marks the store as created
        self._after_record_loaded()

    def _empty_record(self) -> dict:
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "commit": 0,
            "committed_at": "",
            "num_samples": 0,
            "num_tokens": 0,
            "sample_ids": [],
            "lengths": [],
            "shards": {n: [] for n in TOKEN_ARRAYS},
        }

    def _load_existing(self, repair: bool) -> None:
        from .reader import read_attrs, read_layouts, read_record

        p = self.path
        stored = StoreSpec.from_attributes(read_attrs(p))
        bad = self.spec.mismatches(stored)
        if bad:
            raise StoreMismatchError(
                f"{p} was written for a different model/config: "
                + "; ".join(bad)
                + ". Point this task at a new run directory, or delete the store to recompute it."
            )
        self.spec = stored  # keep what the store says (e.g. its eagle-batch version)
        self.layouts = read_layouts(p)
        want = (self._chunk_tokens(), self.cfg.shard_tokens, self.cfg.codec)
        have = (
            self.layouts["hidden_states"].chunk_tokens,
            self.layouts["hidden_states"].shard_tokens,
            self.layouts["hidden_states"].codec.name,
        )
        if want != have:
            # Appending with the store's own layout is always correct; say so rather than fail a resume.
            import warnings

            warnings.warn(
                f"{p}: existing layout (chunk_tokens, shard_tokens, codec)={have} differs from the "
                f"config's {want}; keeping the store's layout.",
                stacklevel=3,
            )
        self.record = read_record(p)
        complete = (p / COMPLETE_NAME).is_file()
        for f in p.rglob("*" + PARTIAL_SUFFIX):
            f.unlink()
        if not complete:
            for name in ("offsets", "sample_ids"):  # from an interrupted finalize(); rewritten by the next
                if (p / name).exists():
                    shutil.rmtree(p / name)
            root_meta = json.loads((p / "zarr.json").read_bytes())
            if root_meta.pop("consolidated_metadata", None) is not None:  # it describes that finalize's state
                write_json_atomic(p / "zarr.json", root_meta, self.fsync)
        self._after_record_loaded()
        for lay in self.layouts.values():
            self._drop_uncommitted_shards(lay)
        damaged = self._check_committed_files()
        if repair and not damaged:
            # A full check (file crc32c of every shard), so the repair also finds flipped bytes.
            from .verify import verify_store

            damaged = [
                (p_.shard * self.layouts[p_.array].shard_tokens, str(p_))
                for p_ in verify_store(p, False)
                if p_.shard is not None and p_.kind in ("missing", "truncated", "size", "checksum", "decode")
            ]
        if damaged:
            if not repair:
                raise StoreCorruptError(
                    f"{p}: committed data is damaged: "
                    + "; ".join(msg for _, msg in damaged)
                    + ". Run `eagle-batch verify` on it; open with repair=True (`eagle-batch resume --repair`) "
                    "to recompute from the first damaged shard on, or delete the store to recompute all of it."
                )
            self._truncate_before(min(first_token for first_token, _ in damaged))
        self._set_shapes(self.record["num_tokens"])

    def _after_record_loaded(self) -> None:
        r = self.record
        self._sample_ids: list[str] = list(r["sample_ids"])
        self._lengths: list[int] = list(r["lengths"])
        self._id_set = set(self._sample_ids)
        self._num_tokens = int(r["num_tokens"])
        self._shard_tables = {n: {int(s["index"]): s for s in r["shards"][n]} for n in TOKEN_ARRAYS}
        self._committed_ids: frozenset[str] | None = None

    def _drop_uncommitted_shards(self, lay: ArrayLayout) -> None:
        root = self.path / lay.name / "c"
        if not root.is_dir():
            return
        keep = set(self._shard_tables[lay.name])
        for d in list(root.iterdir()):
            try:
                k = int(d.name)
            except ValueError:
                k = -1
            if k not in keep:
                shutil.rmtree(d) if d.is_dir() else d.unlink()

    def _check_committed_files(self) -> list[tuple[int, str]]:
        """Cheap checks of committed shards (existence, size; full crc of tail shards). -> (first token, msg)."""
        damaged = []
        for name, lay in self.layouts.items():
            for k in range(-(-self._num_tokens // lay.shard_tokens)):  # the record must cover its own tokens
                want = min(lay.shard_tokens, self._num_tokens - k * lay.shard_tokens)
                info = self._shard_tables[name].get(k)
                if info is None or info["tokens"] != want:
                    damaged.append(
                        (
                            k * lay.shard_tokens,
                            f"{name} shard {k}: the record's shard table does not cover its {want} committed tokens",
                        )
                    )
                    self._shard_tables[name].pop(k, None)
            for k, info in sorted(self._shard_tables[name].items()):
                f = lay.shard_path(self.path, k)
                first = k * lay.shard_tokens
                if not f.is_file():
                    damaged.append((first, f"{name} shard {k} ({f.relative_to(self.path)}) is missing"))
                    continue
                if info["tokens"] < lay.shard_tokens:  # tail shard: may hold an interrupted commit's rewrite
                    data = f.read_bytes()
                    if len(data) == info["nbytes"] and crc32c.crc32c(data) == info["crc32c"]:
                        continue
                    try:
                        self._restore_tail_file(lay, k, info, data)
                    except (ShardError, StoreCorruptError, ValueError) as e:
                        damaged.append((first, f"{name} tail shard {k}: {e}"))
                elif f.stat().st_size != info["nbytes"]:
                    damaged.append(
                        (
                            first,
                            f"{name} shard {k} ({f.relative_to(self.path)}) has "
                            f"{f.stat().st_size} bytes, the record says {info['nbytes']}",
                        )
                    )
        return damaged

    def _decode_rows(self, lay: ArrayLayout, data: bytes, tokens: int, where: str) -> np.ndarray:
        index = decode_index(data[-lay.index_nbytes() :], lay.chunks_per_shard, where)
        dec = make_decoder(lay.codec)
        n_chunks = -(-tokens // lay.chunk_tokens)
        out = np.empty((n_chunks * lay.chunk_tokens, *lay.row_shape), lay.np_dtype)
        flat = out.reshape(n_chunks, -1)
        for c in range(n_chunks):
            off, nb = index[c]
            if off == EMPTY:
                raise ShardError(f"{where}: inner chunk {c} is absent but the record covers it")
            raw = np.frombuffer(dec(data[int(off) : int(off + nb)]), lay.np_dtype)
            if raw.size != flat.shape[1]:
                raise ShardError(f"{where}: inner chunk {c} decodes to {raw.size} values, expected {flat.shape[1]}")
            flat[c] = raw
        return out[:tokens]

    def _restore_tail_file(self, lay: ArrayLayout, k: int, info: dict, data: bytes) -> None:
        """An interrupted commit replaced the tail shard: keep exactly the committed prefix if it checks out."""
        where = str(lay.shard_path(self.path, k))
        rows = self._decode_rows(lay, data, info["tokens"], where)
        if crc32c.crc32c(rows) != info["raw_crc32c"]:
            raise StoreCorruptError(f"{where}: the committed rows' crc32c does not match the record")
        self._rewrite_prefix_shard(lay, k, rows)

    def _rewrite_prefix_shard(self, lay: ArrayLayout, k: int, rows: np.ndarray) -> None:
        st = _Stream(lay, self)
        chunks = []
        for c0 in range(0, len(rows), lay.chunk_tokens):
            part = rows[c0 : c0 + lay.chunk_tokens]
            if len(part) < lay.chunk_tokens:
                padded = np.zeros((lay.chunk_tokens, *lay.row_shape), lay.np_dtype)
                padded[: len(part)] = part
                part = padded
            chunks.append(st.encode(np.ascontiguousarray(part)))
        info = self._write_shard(lay, k, chunks, len(rows), crc32c.crc32c(rows))
        self._shard_tables[lay.name][k] = info
        self._update_record_tables()
        write_json_atomic(self.path / PROGRESS_NAME, self.record, self.fsync)

    def _update_record_tables(self) -> None:
        self.record["shards"] = {
            n: [self._shard_tables[n][k] for k in sorted(self._shard_tables[n])] for n in TOKEN_ARRAYS
        }

    def _truncate_before(self, token: int) -> None:
        """Drop committed samples from the last sample boundary <= `token` on (repair)."""
        bounds = np.concatenate([[0], np.cumsum(self._lengths, dtype=np.int64)])
        keep = int(np.searchsorted(bounds, token, side="right") - 1)
        t = int(bounds[keep])
        import warnings

        warnings.warn(
            f"{self.path}: repair drops committed samples {keep}..{len(self._lengths) - 1} "
            f"(from token {t}); they will be recomputed.",
            stacklevel=4,
        )
        if (self.path / COMPLETE_NAME).is_file():  # no longer complete: un-finalize first, marker first
            (self.path / COMPLETE_NAME).unlink()
            if self.fsync:
                fsync_dir(self.path)
            for name in ("offsets", "sample_ids"):
                if (self.path / name).exists():
                    shutil.rmtree(self.path / name)
            root_meta = json.loads((self.path / "zarr.json").read_bytes())
            root_meta.pop("consolidated_metadata", None)
            write_json_atomic(self.path / "zarr.json", root_meta, self.fsync)
        for name, lay in self.layouts.items():
            table = self._shard_tables[name]
            for k in sorted(table):
                start = k * lay.shard_tokens
                f = lay.shard_path(self.path, k)
                if start >= t:
                    del table[k]
                    f.unlink(missing_ok=True)
                elif start + table[k]["tokens"] > t:  # the shard holding the new end: keep its prefix
                    data = f.read_bytes()
                    rows = self._decode_rows(lay, data, t - start, str(f))
                    self._rewrite_prefix_shard(lay, k, rows)
        self._sample_ids = self._sample_ids[:keep]
        self._lengths = self._lengths[:keep]
        self._id_set = set(self._sample_ids)
        self._num_tokens = t
        self._write_record()

    def _restore_tail(self, st: _Stream) -> None:
        """Load the committed tail shard back into the stream so appending continues where it stopped."""
        lay = st.layout
        table = self._shard_tables[lay.name]
        n = self._num_tokens
        st.shard, st.fill = divmod(n, lay.shard_tokens)
        if st.fill == 0:
            return
        info = table[st.shard]
        f = lay.shard_path(self.path, st.shard)
        data = f.read_bytes()
        index = decode_index(data[-lay.index_nbytes() :], lay.chunks_per_shard, str(f))
        full, part = divmod(st.fill, lay.chunk_tokens)
        st.chunks = [data[int(o) : int(o + b)] for o, b in index[:full]]
        st.restored = full
        if part:
            rows = self._decode_rows(lay, data, st.fill, str(f))
            st.buf[:part] = rows[full * lay.chunk_tokens :]
            st.buf_fill = part
            st.restored_crc = crc32c.crc32c(rows[: full * lay.chunk_tokens])
        else:
            st.restored_crc = int(info["raw_crc32c"])

    # ----- background work -----

    def _submit_encode(self, st: _Stream, chunks: list[np.ndarray], loan: _Loan | None) -> list:
        """One entry per chunk for the stream's `chunks`. `loan`: `chunks` are the caller's memory (else a single
        one of the stream's buffers, recycled after use)."""
        if st.layout.name != "hidden_states":
            # Token ids and masks: ~1 KiB chunks, kept as they are and encoded by their shard's IO job. A job
            # each on the compression pool cost more interpreter time (submit, wake-up, future, callback)
            # than the encoding itself, and 2/3 of all jobs were these (16-core H200 host, ingest probe:
            # 3.65 -> 4.17 GB/s without them).
            return chunks
        # Raw only pays while the disk keeps up: once shard writes queue up (the disk is the bottleneck, as
        # with fsync on a ~1 GB/s disk: 62% raw chunks, ratio 1.13 on an H200 run) a raw chunk adds bytes to
        # the slowest stage, so the producer waits for a compression slot instead, which costs no time it
        # would not spend waiting for the disk anyway. The disk is asked again while waiting: its queue
        # drains while compression may stay stuck.
        t0 = None
        while not self._encode_slots.acquire(blocking=False):
            if st.raw_header is not None and self._io_backlog() < self.IO_QUEUE_RAW_LIMIT:
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
        return [_Encoded(fut, i) for i in range(len(chunks))]

    def _keep_raw(self, st: _Stream, chunks: list[np.ndarray], loan: _Loan | None) -> list:
        raws = []
        for chunk in chunks:
            st.chunks_raw += 1
            raw = _RawChunk(st.raw_header, chunk)
            if loan is not None:  # a raw chunk lives until its shard is written, a loan must not: copy
                loan.hold()
                raw.detached = self._io_pools[st.layout.name].submit(raw.detach, st._new_buf(), loan)
            raws.append(raw)
        return raws

    def _io_backlog(self) -> int:
        """Shard writes the disk is behind on: every chunk encoded, waiting for or inside the write. A shard
        still waiting for its chunks' compression is the compression's backlog, not the disk's: counting it
        (as this once did) turned raw chunks off exactly when compression was the bottleneck (16-core H200
        host: 0 raw chunks, the engine waiting 2.8 s on the store)."""
        return self._io_writing

    def _submit_shard(self, st: _Stream, k: int, chunks: list, tokens: int, restored: int, restored_crc: int) -> None:
        self._harvest_io()
        # More than a few shards waiting for the disk means it is the bottleneck: wait here rather than buffer.
        # Shards still waiting for their chunks' compression do not count: compression is bounded by its
        # slots, where store.adaptive keeps chunks raw instead of waiting. (Counting them made the writer
        # wait here, never at the slots, so a compression-bound H200 capture kept 0 chunks raw; engine 0.50
        # of plain.) IO_QUEUE_CAP bounds the list itself.
        while self._pending_io and (
            self._io_backlog() >= self.IO_QUEUE_LIMIT or len(self._pending_io) >= self.IO_QUEUE_CAP
        ):
            t0 = time.perf_counter()
            try:
                self._record_shard(*self._pending_io.pop(0).result())
            except BaseException as e:  # a failed background write: no later commit may claim it
                self._broken = e
                raise
            finally:
                self.stall_s["io"] += time.perf_counter() - t0
        self._pending_io.append(
            self._write_when_encoded(
                st,
                [c.fut for c in chunks if isinstance(c, _Encoded)],
                (st.layout, k, chunks, tokens, restored, restored_crc, None, True, st),
            )
        )

    def _write_when_encoded(self, st: _Stream, encodes: list[Future], job_args: tuple) -> Future:
        """The shard write, handed to an IO thread only once its chunks are encoded: a write waiting for
        compression on an IO thread kept ready shards (raw chunks) from the disk behind it, until the list hit
        IO_QUEUE_CAP and append() waited (H200 host: 2.9 s of a 6.4 s capture). The returned future is the
        write's; `_io_writing` counts it from ready to written (see _io_backlog)."""
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
                self._broken = e
                raise
        self._pending_io = keep

    def _record_shard(self, name: str, info: dict) -> None:
        # Tables feed the record only at the next commit; a tail rewrite replaces the older entry.
        self._shard_tables[name][info["index"]] = info

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
        recycle_to: _Stream | None = None,
    ) -> tuple[str, dict]:
        """IO thread: write shard k from `chunks` (+ the padded `tail` chunk); its raw crc32c is the restored
        prefix's crc combined with each later chunk's, in row order."""
        t0 = self.trace.stamp()
        chunk_nbytes = lay.chunk_tokens * lay.row_nbytes
        pieces: list = []
        piece_crcs: list = []  # crc32c of each piece as written, where known without another pass
        raw_crc = restored_crc
        for i, c in enumerate(chunks):
            if isinstance(c, _Encoded):
                data, crc, data_crc, _ = c.result()
            elif isinstance(c, np.ndarray):  # a small array's chunk, encoded here
                data, crc, data_crc = self._streams[lay.name].encode(c), crc32c.crc32c(c), None
            elif isinstance(c, _RawChunk):  # header + raw rows: the frame's crc from the rows' crc
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
            recycle_to.free.extend(
                c.buf if isinstance(c, _RawChunk) else c for c in chunks if isinstance(c, (_RawChunk, np.ndarray))
            )
            recycle_to.out_free.extend(
                out for c in chunks if isinstance(c, _Encoded) and (out := c.result()[3]) is not None
            )
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
        """`pieces`: one per inner chunk, its encoded bytes or a tuple of buffers written back to back.
        `piece_crcs`: each piece's crc32c where already known (None: computed here)."""
        index = np.full((lay.chunks_per_shard, 2), EMPTY, dtype="<u8")
        off = 0
        crc = 0
        flat: list = []
        for c, piece in enumerate(pieces):
            parts = piece if isinstance(piece, tuple) else (piece,)
            size = sum(memoryview(b).nbytes for b in parts)
            known = piece_crcs[c] if piece_crcs is not None else None
            if known is None:
                for b in parts:
                    crc = crc32c.crc32c(b, crc)
            else:  # the file's crc over this piece without reading it again
                crc = crc32c_combine(crc, known, size)
            index[c] = (off, size)
            off += size
            flat.extend(parts)
        idx = encode_index(index)
        crc = crc32c.crc32c(idx, crc)
        f = lay.shard_path(self.path, k)
        defer = self._dirty_dirs if defer_dir_sync else None
        makedirs_durable(f.parent, self.fsync, defer)
        write_atomic(f, [*flat, idx], fsync=self.fsync, sync_dir=not defer_dir_sync)
        if defer is not None:
            defer.add(f.parent)
        return {"index": k, "tokens": tokens, "nbytes": off + len(idx), "crc32c": crc, "raw_crc32c": int(raw_crc)}

    # ----- public API -----

    @property
    def committed_sample_ids(self) -> frozenset[str]:
        """Ids of the samples in the committed record (what survives a crash)."""
        if self._committed_ids is None:  # cached: callers test membership once per sample
            self._committed_ids = frozenset(self.record["sample_ids"])
        return self._committed_ids

    def encoder_info(self) -> dict:
        """How hidden_states chunks are compressed: eagle-batch's entropy-only frames, c-blosc/zstd called
        into our buffers (`direct`), or numcodecs' own encode; and why a faster path is not in use."""
        e = self._streams["hidden_states"].encoder
        return {
            "entropy_only": e.entropy_only,
            "direct": e.direct,
            "why_not_entropy_only": e.why_not_entropy or None,
            "why_not_direct": e.why_not_direct or None,
        }

    def chunk_stats(self) -> dict[str, int]:
        """hidden_states inner chunks compressed vs kept raw by `store.adaptive` since open()."""
        st = self._streams["hidden_states"]
        return {"compressed": st.chunks_compressed, "stored_raw": st.chunks_raw}

    @property
    def num_committed(self) -> int:
        return int(self.record["num_samples"])

    @property
    def num_appended(self) -> int:
        return len(self._sample_ids)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def is_complete(self) -> bool:
        return self._complete

    def append(
        self,
        sample_id: str,
        input_ids: Any,
        loss_mask: Any,
        hidden_states: Any,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        """Queue one sample; durable only after the next commit().

        Without `on_release` the rows are copied before append returns. With it, `hidden_states` is lent:
        the writer may read it in place from its compression threads after append returned, and calls
        `on_release()` exactly once (from any thread; also when append raises) when it no longer reads
        it. The caller must not modify or reuse that memory before.
        """
        self.append_block([sample_id], [input_ids], [loss_mask], hidden_states, on_release)

    def append_block(
        self,
        sample_ids: list,
        input_ids: list,
        loss_masks: list,
        hidden_states: Any,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        """Queue consecutive samples whose hidden states lie back to back in one `[sum T, L, H]` block (as
        the capture receives an engine step's finished requests); like `append` for each, lending the block
        as a whole with `on_release`. Every sample is checked before any is queued: either all or none.

        Chunks are compressed in place wherever they lie inside the block, also across sample boundaries:
        only the block's first and last partial chunks are copied, where per-sample appends of varied
        lengths copy about one chunk per sample."""
        loan = _Loan(on_release) if on_release is not None else None
        t0 = self.trace.stamp()
        try:
            self._append_block(sample_ids, input_ids, loss_masks, hidden_states, loan)
        finally:
            if loan is not None:
                loan.drop()
            self.trace.event("append", t0, sample=str(sample_ids[0]) if sample_ids else "", samples=len(sample_ids))

    def _append_block(
        self, sample_ids: list, input_ids: list, loss_masks: list, hidden_states: Any, loan: _Loan | None
    ) -> None:
        self._check_open()
        if self._complete:
            raise StoreError(f"{self.path} is finalized (complete marker present); it takes no more samples.")
        if not (len(sample_ids) == len(input_ids) == len(loss_masks)) or not sample_ids:
            raise ValueError(
                f"append_block: {len(sample_ids)} sample ids, {len(input_ids)} input_ids, "
                f"{len(loss_masks)} loss masks; give one of each per sample (at least one)"
            )
        hs = hidden_states_to_uint16(hidden_states)
        sids = [str(x) for x in sample_ids]
        ids = [_as_1d("input_ids", x, np.dtype(np.int32)) for x in input_ids]
        masks = [_as_1d("loss_mask", x, np.dtype(np.uint8)) for x in loss_masks]
        row = (self.spec.num_layers, self.spec.hidden_size)
        total = 0
        for sid, i, m in zip(sids, ids, masks):
            if sid in self._id_set:
                raise ValueError(
                    f"sample_id {sid!r} is already in {self.path}; skip samples in "
                    "writer.committed_sample_ids before running them."
                )
            if len(sids) > 1 and sids.count(sid) > 1:
                raise ValueError(f"sample_id {sid!r} appears more than once in one append_block call")
            if len(i) == 0:
                raise ValueError(f"sample {sid!r} has no tokens")
            if len(m) != len(i):
                raise ValueError(
                    f"sample {sid!r}: shapes disagree: input_ids {i.shape}, loss_mask {m.shape}; "
                    "expected one mask entry per token."
                )
            total += len(i)
        if hs.shape != (total, *row):
            what = f"sample {sids[0]!r}" if len(sids) == 1 else f"samples {sids[0]!r}..{sids[-1]!r}"
            raise ValueError(
                f"{what}: shapes disagree: input_ids [{total}] tokens, hidden_states {hs.shape}; "
                f"expected {[total, *row]} (layer_ids={self.spec.layer_ids}, "
                f"hidden_size={self.spec.hidden_size})."
            )
        self._streams["input_ids"].push(ids[0] if len(ids) == 1 else np.concatenate(ids))
        self._streams["loss_mask"].push(masks[0] if len(masks) == 1 else np.concatenate(masks))
        self._streams["hidden_states"].push(np.ascontiguousarray(hs), loan)
        for sid, i in zip(sids, ids):
            self._sample_ids.append(sid)
            self._id_set.add(sid)
            self._lengths.append(len(i))
            self._num_tokens += len(i)

    def commit(self) -> None:
        """Durability barrier: on return every appended sample is on disk and in the committed record."""
        self._check_open()
        if len(self._sample_ids) == self.record["num_samples"]:
            return
        t0 = self.trace.stamp()
        try:
            self._commit()
            self.trace.event("commit", t0, samples=len(self._sample_ids))
        except BaseException as e:
            self._broken = e
            raise
        self._report_commit()

    def _commit(self) -> None:
        for st in self._streams.values():
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
        self._drain_io()
        if self.fsync:
            dirs, self._dirty_dirs = self._dirty_dirs, set()
            for d in sorted(dirs, key=lambda d: -len(d.parts)):
                fsync_dir(d)
        self._write_record()
        self._set_shapes(self._num_tokens)

    def _drain_io(self) -> None:
        pending, self._pending_io = self._pending_io, []
        for fut in pending:
            self._record_shard(*fut.result())

    def _write_record(self) -> None:
        r = self.record
        r.update(
            commit=r["commit"] + 1,
            committed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            num_samples=len(self._sample_ids),
            num_tokens=self._num_tokens,
            sample_ids=list(self._sample_ids),
            lengths=list(self._lengths),
        )
        self._update_record_tables()
        write_json_atomic(self.path / PROGRESS_NAME, r, self.fsync)
        self._committed_ids = None

    def _set_shapes(self, num_tokens: int) -> None:
        # After the record: a plain zarr reader never sees a shape that covers unwritten shards. Synced too,
        # so a power loss cannot leave an empty zarr.json on file systems that do not order rename after data.
        for name, lay in self.layouts.items():
            write_json_atomic(self.path / name / "zarr.json", lay.zarr_json(num_tokens), fsync=self.fsync)

    def finalize(self) -> None:
        """Commit, then write offsets, sample_ids, consolidated metadata and (last) the `complete` marker."""
        self._check_open()
        self.commit()
        if self._complete:
            return
        import warnings

        import zarr

        with warnings.catch_warnings():
            # zarr notes our non-Zarr files (progress.json, .lock) and that consolidation is not in the v3 spec.
            warnings.filterwarnings("ignore", message=".*(not recognized as a component|Consolidated metadata).*")
            self._write_index_arrays(zarr)
        if self.fsync:
            for d in ("offsets", "sample_ids"):
                for f in (self.path / d).rglob("*"):
                    if f.is_file():
                        fd = os.open(f, os.O_RDONLY)
                        os.fsync(fd)
                        os.close(fd)
                    fsync_dir(f.parent if f.is_file() else f)
            fsync_dir(self.path)
        write_json_atomic(
            self.path / COMPLETE_NAME,
            {
                "num_samples": len(self._sample_ids),
                "num_tokens": self._num_tokens,
                "commit": self.record["commit"],
                "finalized_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            self.fsync,
        )
        self._complete = True

    def _write_index_arrays(self, zarr) -> None:
        offsets = np.zeros(len(self._lengths) + 1, np.int64)
        np.cumsum(self._lengths, out=offsets[1:])
        root = zarr.open_group(self.path, mode="r+", zarr_format=3)
        a = root.create_array(
            "offsets",
            shape=offsets.shape,
            dtype="int64",
            chunks=(max(1, min(len(offsets), 1 << 18)),),
            compressors=None,
            overwrite=True,
        )
        a[:] = offsets
        ids = np.array(self._sample_ids, dtype=object)
        s = root.create_array(
            "sample_ids", shape=ids.shape, dtype=str, chunks=(max(1, min(len(ids), 1 << 16)),), overwrite=True
        )
        if len(ids):
            s[:] = ids
        zarr.consolidate_metadata(self.path, zarr_format=3)

    def close(self) -> None:
        """Stop background threads and release the lock. Uncommitted samples are dropped (commit first)."""
        if self._closed:
            return
        self._closed = True
        try:
            for fut in self._pending_io:
                fut.cancel()
            self._encode_pool.shutdown(wait=True, cancel_futures=True)
            for pool in self._io_pools.values():
                pool.shutdown(wait=True, cancel_futures=True)
        finally:
            self.trace.dump()
            if self._lock is not None:
                self._lock.release()

    def _check_open(self) -> None:
        if self._broken is not None:
            raise StoreError(
                f"an earlier commit of {self.path} failed ({self._broken!r}); close this writer and "
                "reopen the store, which recovers the last committed record."
            )
        if self._closed:
            raise StoreError(f"the writer of {self.path} is closed; open a new one with TaskStoreWriter.open().")

    def __enter__(self) -> "TaskStoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort if a caller forgets close()
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass


def committed_samples_of_shard(record: dict, shard_tokens: int, k: int) -> list[int]:
    """Sample indices whose tokens overlap shard k (what a repair must recompute)."""
    bounds = np.concatenate([[0], np.cumsum(record["lengths"], dtype=np.int64)])
    lo, hi = k * shard_tokens, (k + 1) * shard_tokens
    first = int(np.searchsorted(bounds, lo, side="right") - 1)
    last = int(np.searchsorted(bounds, hi, side="left"))
    return list(range(max(first, 0), min(last, len(record["lengths"]))))

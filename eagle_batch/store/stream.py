"""Stream: the rows of one token array on their way into shard files.

A stream cuts the token-major rows it is given into inner chunks and the chunks into shards. Rows are
copied into one of its chunk buffers only where a chunk spans two appends, or where the caller did not lend
them; whole chunks inside lent rows (a `Loan`) are compressed straight from the caller's memory. Every full
chunk becomes an entry of the shard being filled: being encoded (`Encoded`), kept raw (`RawChunk`, by
store.adaptive), rows its shard's IO job encodes (token ids and masks), or bytes restored from disk on
resume. A full shard goes to the ingest (ingest.py) for writing; the partly filled one is written by
each commit (`tail()`).

Buffers are recycled (`free`, `out_free`): fresh multi-MB allocations page-fault on every first touch, which
costs more than the copy into a reused buffer. A buffer goes back once nothing refers to it any more: a
chunk buffer after its encoding (or, kept raw, after its full shard is written), an encoded-output buffer
after its full shard is written.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

import crc32c
import numpy as np

from .blosc_frame import memcpyed_header
from .encoder import ChunkEncoder
from .format import ArrayLayout, Codec
from .loan import Loan
from .trace import StoreTrace


class Scheduler(Protocol):
    """What a stream needs from the ingest that owns it (ingest.Ingest): where its full chunks are encoded
    and its full shards written."""

    JOB_BYTES: int
    trace: StoreTrace

    def submit_encode(self, st: Stream, chunks: list[np.ndarray], loan: Loan | None) -> list: ...

    def submit_shard(self, st: Stream, k: int, chunks: list, tokens: int, restored: int, restored_crc: int) -> None: ...


class RawChunk:
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

    def detach(self, own: np.ndarray, loan: Loan) -> None:
        np.copyto(own, self.buf)
        self.buf = own
        loan.drop()


class Encoded:
    """Chunk `i` of a compression job: the job's Future gives one (encoded bytes, raw crc32c, encoded crc32c,
    buffer of ours or None) per chunk."""

    __slots__ = ("fut", "i")

    def __init__(self, fut: Future, i: int):
        self.fut = fut
        self.i = i

    def result(self) -> tuple:
        return self.fut.result()[self.i]


def blosc_raw_header(codec: Codec, chunk_shape: tuple, dtype: np.dtype) -> bytes | None:
    """The header of a memcpyed blosc frame of one full chunk (None: not blosc, or not that frame layout, so
    always compress)."""
    if codec.name != "blosc-zstd":
        return None
    return memcpyed_header(int(np.prod(chunk_shape)) * dtype.itemsize, dtype.itemsize, codec.blocksize)


def chunk_encoder(layout: ArrayLayout, entropy_only: bool) -> ChunkEncoder:
    """The encoder of `layout`'s chunks: eagle-batch's entropy-only frames apply to hidden states only."""
    return ChunkEncoder(
        layout.codec, layout.np_dtype.itemsize, entropy_only=layout.name == "hidden_states" and entropy_only
    )


class Stream:
    """Rows of one token array on their way into shard files (see the module docstring)."""

    def __init__(self, layout: ArrayLayout, ingest: Scheduler, adaptive: bool, entropy_only: bool):
        self.layout = layout
        self.ingest = ingest
        self.encoder = chunk_encoder(layout, entropy_only)
        self.raw_header = (
            blosc_raw_header(layout.codec, (layout.chunk_tokens, *layout.row_shape), layout.np_dtype)
            if adaptive
            else None
        )
        self.chunks_compressed = 0
        self.chunks_raw = 0
        self.shard = 0  # index of the shard being filled
        self.fill = 0  # rows in that shard
        # Its full inner chunks: being encoded (`Encoded`), kept raw, rows to be encoded by the shard's IO job
        # (ndarray: token ids and masks), or restored from disk (bytes; the first `restored` entries, whose rows'
        # crc32c is `restored_crc`).
        self.chunks: list[Encoded | bytes | RawChunk | np.ndarray] = []
        self.restored = 0
        self.restored_crc = 0
        self.free: list[np.ndarray] = []  # chunk buffers
        self.out_free: list[np.ndarray] = []  # encoded-output buffers (encoder.py says why they are ours)
        self._out_nbytes = self.encoder.bound(layout.chunk_tokens * layout.row_nbytes)
        self.buf = self.new_buf()
        self.buf_fill = 0

    def resume(self, shard: int, fill: int, chunks: list[bytes], part_rows: np.ndarray, restored_crc: int) -> None:
        """Continue a committed tail shard: its `fill` rows are the encoded full `chunks` (crc32c of their rows:
        `restored_crc`) and `part_rows`, the rows of its partly filled chunk."""
        self.shard, self.fill = shard, fill
        self.chunks = list(chunks)
        self.restored = len(chunks)
        self.restored_crc = restored_crc
        self.buf[: len(part_rows)] = part_rows
        self.buf_fill = len(part_rows)

    def new_buf(self) -> np.ndarray:
        try:
            return self.free.pop()  # atomic; IO threads take buffers too (raw chunks of lent rows)
        except IndexError:
            pass
        return np.empty((self.layout.chunk_tokens, *self.layout.row_shape), self.layout.np_dtype)

    def encode(self, chunk: np.ndarray) -> bytes:
        return self.encoder.encode(chunk, None)

    def encode_job(self, chunks: list[np.ndarray], loan: Loan | None) -> list[tuple]:
        """Runs on a compression thread: per chunk (encoded bytes, crc32c of the raw rows, crc32c of the encoded
        bytes, the buffer of ours holding them or None)."""
        trace = self.ingest.trace
        t0 = trace.stamp()
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
            trace.event(
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

    def push(self, rows: np.ndarray, loan: Loan | None = None) -> None:
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
                    max(1, self.ingest.JOB_BYTES // (C * lay.row_nbytes)),
                )
                entries = self.ingest.submit_encode(
                    self, [rows[pos + i * C : pos + (i + 1) * C] for i in range(k)], loan
                )
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
            chunk, self.buf, self.buf_fill = self.buf, self.new_buf(), 0
            self._add_chunk(self.ingest.submit_encode(self, [chunk], None)[0], n)

    def _add_chunk(self, entry: Encoded | RawChunk | np.ndarray, new_rows: int) -> None:
        """A full chunk whose last `new_rows` rows were not yet counted in `fill`."""
        self.chunks.append(entry)
        self.fill += new_rows
        if self.fill == self.layout.shard_tokens:
            self.ingest.submit_shard(self, self.shard, list(self.chunks), self.fill, self.restored, self.restored_crc)
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

    def recycle(self, chunks: list) -> None:
        """A full shard of `chunks` is on disk: its raw chunks' and encoded chunks' buffers are free again."""
        self.free.extend(
            c.buf if isinstance(c, RawChunk) else c for c in chunks if isinstance(c, (RawChunk, np.ndarray))
        )
        self.out_free.extend(out for c in chunks if isinstance(c, Encoded) and (out := c.result()[3]) is not None)

"""One shard file's bytes: writing it from encoded inner chunks, and decoding it back.

A shard file is zarr's `sharding_indexed` layout with the index at the end: the encoded inner chunks back
to back, then the index (`chunks_per_shard` x (offset, nbytes), little-endian uint64; 2^64-1 twice for
an absent chunk) and the index's crc32c. Encoding an inner chunk is the ChunkEncoder's job (encoder.py);
this module frames chunks into a file and back.

`ShardDecoder` is the one decoder of shard bytes in the package: the writer's recovery (a tail shard's
committed prefix), the reader (rows of a sample) and verify (every committed row) all use it, so a
damaged index, an absent chunk the record covers, a chunk that does not decode or decodes to the wrong
size is found the same way everywhere and raised as a `ShardError` naming the file and the chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import crc32c
import numpy as np

from .crc import crc32c_combine
from .durable import makedirs_durable, write_atomic
from .errors import ShardError
from .format import EMPTY, ArrayLayout, make_decoder

# --- the index ------------------------------------------------------------------------------------


def encode_index(offsets_nbytes: np.ndarray) -> bytes:
    """[n, 2] uint64 (offset, nbytes) -> index bytes + crc32c, as ShardingCodec's index_codecs write it."""
    raw = np.ascontiguousarray(offsets_nbytes, dtype="<u8").tobytes()
    return raw + np.uint32(crc32c.crc32c(raw)).astype("<u4").tobytes()


def decode_index(buf: bytes, n_chunks: int, where: str) -> np.ndarray:
    raw, crc = buf[:-4], int(np.frombuffer(buf[-4:], "<u4")[0])
    if len(raw) != n_chunks * 16 or crc32c.crc32c(raw) != crc:
        raise ShardError(where, "shard index is damaged (checksum mismatch or wrong size)")
    return np.frombuffer(raw, "<u8").reshape(n_chunks, 2)


# --- writing --------------------------------------------------------------------------------------


def write_shard(
    store: Path,
    lay: ArrayLayout,
    k: int,
    pieces: list,
    tokens: int,
    raw_crc: int,
    *,
    fsync: bool,
    dirty_dirs: set | None = None,
    piece_crcs: list | None = None,
) -> dict:
    """Write shard k of `lay` atomically (durable.write_atomic) and return its entry for the record.

        `pieces`: one per inner chunk in row order, its encoded bytes or a tuple of buffers written back to back
        (a raw blosc frame: header, rows). `piece_crcs`: each piece's crc32c where already known (None: read
        here), so the file's crc32c is combined without another pass over the bytes. `raw_crc`: crc32c of the
        shard's first `tokens` raw rows. The entry also lists each inner chunk's crc32c as encoded
    (`chunk_crc32c`, in chunk order): what a reader checks each chunk it decodes against. `dirty_dirs`: leave the directory fsyncs to the next commit (the set
        collects the directories), else fsync them now."""
    index = np.full((lay.chunks_per_shard, 2), EMPTY, dtype="<u8")
    off = 0
    crc = 0
    flat: list = []
    chunk_crcs: list[int] = []
    for c, piece in enumerate(pieces):
        parts = piece if isinstance(piece, tuple) else (piece,)
        size = sum(memoryview(b).nbytes for b in parts)
        known = piece_crcs[c] if piece_crcs is not None else None
        if known is None:
            known = 0
            for b in parts:
                known = crc32c.crc32c(b, known)
        chunk_crcs.append(int(known))
        crc = crc32c_combine(crc, known, size)  # the file's crc over this piece without reading it again
        index[c] = (off, size)
        off += size
        flat.extend(parts)
    idx = encode_index(index)
    crc = crc32c.crc32c(idx, crc)
    f = lay.shard_path(store, k)
    makedirs_durable(f.parent, fsync, dirty_dirs)
    write_atomic(f, [*flat, idx], fsync=fsync, sync_dir=dirty_dirs is None)
    if dirty_dirs is not None:
        dirty_dirs.add(f.parent)
    return {
        "index": k,
        "tokens": tokens,
        "nbytes": off + len(idx),
        "crc32c": crc,
        "raw_crc32c": int(raw_crc),
        "chunk_crc32c": chunk_crcs,
    }


def padded_chunks(lay: ArrayLayout, rows: np.ndarray) -> Iterator[np.ndarray]:
    """`rows` (a shard's first len(rows) rows) cut into contiguous inner chunks, the last zero-padded (the
    arrays' fill value)."""
    for c0 in range(0, len(rows), lay.chunk_tokens):
        part = rows[c0 : c0 + lay.chunk_tokens]
        if len(part) < lay.chunk_tokens:
            padded = np.zeros((lay.chunk_tokens, *lay.row_shape), lay.np_dtype)
            padded[: len(part)] = part
            part = padded
        yield np.ascontiguousarray(part)


# --- reading --------------------------------------------------------------------------------------


class ShardDecoder:
    """Decodes the shard files of one array (`lay`). `where` arguments name the file in errors."""

    def __init__(self, lay: ArrayLayout):
        self.lay = lay
        self._decode = make_decoder(lay.codec)
        self._chunk_values = lay.chunk_tokens * (lay.row_nbytes // lay.np_dtype.itemsize)
        self._chunk_shape = (lay.chunk_tokens, *lay.row_shape)

    def index(self, data: bytes, where: str) -> np.ndarray:
        """The [chunks_per_shard, 2] (offset, nbytes) index from a whole shard file's bytes (or its tail)."""
        n = self.lay.index_nbytes()
        if len(data) < n:
            raise ShardError(where, f"file is shorter ({len(data)} bytes) than its shard index")
        return decode_index(data[-n:], self.lay.chunks_per_shard, where)

    @staticmethod
    def covered(index: np.ndarray, c0: int, c1: int, where: str) -> np.ndarray:
        """Index rows of inner chunks c0..c1, which the record covers: none may be absent."""
        sel = index[c0 : c1 + 1]
        absent = np.flatnonzero(sel[:, 0] == EMPTY)
        if len(absent):
            raise ShardError(where, f"inner chunk {c0 + int(absent[0])} is absent but the record covers it")
        return sel

    def chunk(self, encoded, c: int, where: str) -> np.ndarray:
        """Inner chunk c's rows [chunk_tokens, *row_shape] from its encoded bytes."""
        try:
            raw = np.frombuffer(self._decode(encoded), self.lay.np_dtype)
        except Exception as e:  # codec errors come in many types
            raise ShardError(where, f"inner chunk {c} does not decode: {e}") from e
        if raw.size != self._chunk_values:
            raise ShardError(where, f"inner chunk {c} decodes to {raw.size} values, expected {self._chunk_values}")
        return raw.reshape(self._chunk_shape)

    def chunks(self, data: bytes, tokens: int, where: str) -> Iterator[np.ndarray]:
        """The shard's first `tokens` rows, one inner chunk at a time (the last cut to the rows it covers)."""
        C = self.lay.chunk_tokens
        index = self.index(data, where)
        for c in range(-(-tokens // C)):  # in row order: the first damaged chunk is the one reported
            off, nb = (int(x) for x in self.covered(index, c, c, where)[0])
            yield self.chunk(data[off : off + nb], c, where)[: min(C, tokens - c * C)]

    def rows(self, data: bytes, tokens: int, where: str) -> np.ndarray:
        """The shard's first `tokens` rows as one array."""
        out = np.empty((tokens, *self.lay.row_shape), self.lay.np_dtype)
        pos = 0
        for rows in self.chunks(data, tokens, where):
            out[pos : pos + len(rows)] = rows
            pos += len(rows)
        return out

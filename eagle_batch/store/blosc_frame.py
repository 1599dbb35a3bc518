"""BloscFrameWriter: ordinary blosc (v1) frames of byte-shuffled chunks, zstd tuned to entropy coding.

Why the store writes blosc frames itself: c-blosc hands each shuffled block to `ZSTD_compressCCtx` at a
level, and at every positive level zstd spends most of its time searching for repeated strings. bf16
hidden states have almost none: after the byte shuffle the mantissa half of a block is noise and the
exponent half has ~3.2 bits of order-0 entropy. Nearly all of blosc-zstd-1's 1.41x comes from
Huffman-coding those exponent bytes (zstd's literal compression), not from matches. Asking zstd for its
`fast` strategy with a small hash table, a large acceleration (few match probes) and literal compression
kept on gives the same ratio for a fraction of the CPU (docs/decisions/0012 has the measurements and the
`lab/frame_probe.py` command). c-blosc cannot pass those parameters, so this module builds the frame
around zstd's output: the bytes on disk are a standard blosc frame (same header, block starts and
per-block streams as c-blosc 1.x writes with splitting off), and every blosc decoder, zarr's included,
reads them. Only the compressed bytes inside differ from what c-blosc at `clevel` would produce. The
store asks for one block per chunk (see BloscFrameWriter).

Frame layout (c-blosc 1.x, format version 2):
    header (16 B): version, compressor-format version, flags, typesize, nbytes, blocksize, cbytes
    bstarts: one int32 per block, the offset of its stream from the frame start
    per block: int32 stream size, then the zstd frame of the shuffled block (or the shuffled block itself
    when zstd cannot make it smaller: size == block size means "stored")
The header's fixed fields (version bytes, compressor code, the blocksize c-blosc derives from the
configured one) are taken from a frame c-blosc itself writes for a chunk of the same size, so they always
match the installed c-blosc. A chunk that would not fit in nbytes + 16 is written as c-blosc's memcpyed
frame (header + the raw bytes), exactly as c-blosc does.
"""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np

HEADER = struct.Struct("<BBBBiii")  # version, versionlz, flags, typesize, nbytes, blocksize, cbytes
FLAG_SHUFFLE = 0x01
FLAG_MEMCPYED = 0x02
FLAG_BITSHUFFLE = 0x04
FLAG_DONT_SPLIT = 0x10
ZSTD_FORMAT = 4  # c-blosc's compressor-format code for zstd (flags bits 5-7)
OVERHEAD = 16  # c-blosc's BLOSC_MAX_OVERHEAD: the most a frame exceeds its chunk by

# zstd parameters (zstd.h: ZSTD_cParameter). 1002 is ZSTD_c_literalCompressionMode (experimental
# parameter 5, stable in value since zstd 1.4.5); 1 = ZSTD_ps_enable.
_LEVEL, _WINDOW_LOG, _HASH_LOG, _MIN_MATCH, _TARGET_LENGTH, _STRATEGY, _LITERALS = 100, 101, 102, 105, 106, 107, 1002
# The fast strategy with targetLength 64 (acceleration: the match search skips ahead) keeps level 1's ratio
# on the exponent bytes; with targetLength > 0 zstd turns literal compression off by default, hence the
# explicit enable. Matches are rare but real: chat samples that share a prefix (template, system prompt)
# have identical states there, and several short samples share a chunk, so the window spans a whole chunk
# (4 MiB; zstd shrinks it to the input) and the hash table has 8k entries (32 KiB, in L1): smaller ones miss
# those repeats, larger ones gain little. The parameter sets tried and their ratios and rates:
# docs/decisions/0012.
ENTROPY_PARAMS = {_STRATEGY: 1, _WINDOW_LOG: 22, _HASH_LOG: 13, _MIN_MATCH: 7, _TARGET_LENGTH: 64, _LITERALS: 1}


def zstd_is_error(code: int) -> bool:
    return code > (1 << 64) - 120  # ZSTD_isError: the top ~120 size_t values are error codes


class _Zstd:
    """ctypes bindings to the zstd compiled into numcodecs' blosc extension (the one c-blosc uses)."""

    def __init__(self, lib_path: str):
        lib = ctypes.CDLL(lib_path)
        self.create = lib.ZSTD_createCCtx
        self.create.restype = ctypes.c_void_p
        self.free = lib.ZSTD_freeCCtx
        self.free.argtypes = [ctypes.c_void_p]
        self.set = lib.ZSTD_CCtx_setParameter
        self.set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self.set.restype = ctypes.c_size_t
        self.compress2 = lib.ZSTD_compress2  # ctypes drops the GIL for the call
        self.compress2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
        self.compress2.restype = ctypes.c_size_t


class _Context:
    """One thread's zstd context and shuffle buffer (a ZSTD_CCtx is not thread-safe)."""

    def __init__(self, zstd: _Zstd, params: dict[int, int]):
        self._zstd = zstd
        self.cctx = zstd.create()
        if not self.cctx:
            raise MemoryError("ZSTD_createCCtx failed")
        for key, value in params.items():
            if zstd_is_error(zstd.set(self.cctx, key, value)):
                zstd.free(self.cctx)
                self.cctx = None
                raise ValueError(f"zstd rejected parameter {key}={value}")
        self.shuffled = np.empty(0, np.uint8)

    def reserve(self, nbytes: int) -> None:
        if self.shuffled.nbytes < nbytes:
            self.shuffled = np.empty(nbytes, np.uint8)

    def __del__(self) -> None:
        if getattr(self, "cctx", None):
            self._zstd.free(self.cctx)


class BloscFrameWriter:
    """Encodes chunks as blosc-zstd frames with byte shuffle, at `params` (default: entropy coding only).

    `blocksize`: c-blosc's blocksize argument, or None for one block per chunk (what the store uses: the
    frame header carries the block size, so every decoder reads it, and a chunk then costs one zstd call.
    Each call drops and retakes the GIL, which can wait behind busy Python threads, so a block per MiB
    costs several such waits per chunk where one block costs one (docs/decisions/0013 has the measurement).
    zstd's own 128 KiB blocks keep exponent and mantissa bytes apart either way: same ratio).

    `encode(chunk, out)` writes one frame into `out` (at least `len(chunk bytes) + 16` bytes) and returns
    its length; safe to call from many threads at once (each gets its own zstd context)."""

    def __init__(self, blocksize: int | None, typesize: int, params: dict[int, int] | None = None, *, level: int = 1):
        from numcodecs import blosc

        self.typesize = typesize
        self.blocksize = blocksize
        self.params = {_LEVEL: level, **(ENTROPY_PARAMS if params is None else params)}
        self._zstd = _Zstd(blosc.__file__)
        self._local = threading.local()
        self._headers: dict[int, tuple[bytes, bytes, int]] = {}
        self._lock = threading.Lock()
        _Context(self._zstd, self.params)  # fail here, not on a compression thread, if zstd says no

    def _context(self) -> _Context:
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            ctx = self._local.ctx = _Context(self._zstd, self.params)
        return ctx

    def _frame_info(self, nbytes: int) -> tuple[bytes | None, bytes, int]:
        """(header prefix for a compressed frame or None: memcpyed only, c-blosc's memcpyed header, block size)
        for chunks of `nbytes`."""
        info = self._headers.get(nbytes)
        if info is not None:
            return info
        blocksize = nbytes if self.blocksize is None else self.blocksize
        raw_header = memcpyed_header(nbytes, self.typesize, blocksize)
        ref = _blosc_encode(np.zeros(nbytes, np.uint8), self.typesize, blocksize)
        version, versionlz, flags, typesize, n, blocksize, _ = HEADER.unpack_from(ref)
        if raw_header is None or typesize != self.typesize or n != nbytes:
            raise ValueError(f"c-blosc's memcpyed frame for {nbytes} bytes is not header + bytes")
        if flags & FLAG_MEMCPYED:  # c-blosc does not compress chunks this small (< 128 bytes): neither do we
            prefix = None
        elif flags & FLAG_BITSHUFFLE or not flags & FLAG_SHUFFLE or (flags >> 5) != ZSTD_FORMAT:
            raise ValueError(
                f"c-blosc's reference frame for {nbytes} bytes is not a byte-shuffled zstd frame (flags {flags:#x})"
            )
        else:
            prefix = bytes([version, versionlz, (flags | FLAG_DONT_SPLIT) & ~FLAG_MEMCPYED, typesize])
        info = (prefix, raw_header, blocksize)
        with self._lock:
            self._headers[nbytes] = info
        return info

    def encode(self, chunk: np.ndarray, out: np.ndarray) -> int:
        src = chunk.reshape(-1).view(np.uint8)
        n = src.nbytes
        prefix, memcpyed_header, bs = self._frame_info(n)
        if prefix is None:
            return self._memcpyed(src, memcpyed_header, out)
        nblocks = -(-n // bs) if n else 0
        pos = OVERHEAD + 4 * nblocks
        end = n + OVERHEAD  # a frame that would pass this is written memcpyed instead, as c-blosc does
        bstarts = np.empty(nblocks, "<i4")
        ctx = self._context()
        blocks = self._shuffle_blocks(src, bs, ctx)
        zstd, dst = self._zstd, out.ctypes.data
        for b in range(nblocks):
            shuffled = blocks[b * bs : min(n, (b + 1) * bs)]
            size = shuffled.nbytes
            bstarts[b] = pos
            room = min(size - 1, end - pos - 4)  # a stream as long as its block means "stored"
            got = zstd.compress2(ctx.cctx, dst + pos + 4, room, shuffled.ctypes.data, size) if room > 0 else None
            if got is None or zstd_is_error(got):  # zstd could not make it smaller (dstSize_tooSmall): store it
                if pos + 4 + size > end:
                    return self._memcpyed(src, memcpyed_header, out)
                out[pos + 4 : pos + 4 + size] = shuffled
                got = size
            struct.pack_into("<i", out, pos, got)
            pos += 4 + got
        out[:4] = np.frombuffer(prefix, np.uint8)
        struct.pack_into("<iii", out, 4, n, bs, pos)
        out[OVERHEAD : OVERHEAD + 4 * nblocks] = bstarts.view(np.uint8)
        return pos

    def _shuffle_blocks(self, src: np.ndarray, bs: int, ctx: _Context) -> np.ndarray:
        """c-blosc's byte shuffle of every block of `src` (byte j of each element for j = 0..typesize-1, then
        any bytes past the last whole element), all full blocks in one pass and the leftover block in
        another. Each numpy call drops and retakes the GIL, and retaking it can wait a whole switch interval
        (5 ms) behind a busy Python thread, so the calls per chunk are kept few."""
        n = src.nbytes
        ctx.reserve(n)
        out = ctx.shuffled[:n]
        k = n // bs
        if k:
            self._shuffle_rows(src[: k * bs].reshape(k, bs), out[: k * bs].reshape(k, bs))
        if n > k * bs:
            self._shuffle_rows(src[k * bs :].reshape(1, -1), out[k * bs :].reshape(1, -1))
        return out

    def _shuffle_rows(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Shuffle each row (a block) of `rows` into the same row of `out`."""
        t, size = self.typesize, rows.shape[1]
        m = size // t
        if t == 1:
            np.copyto(out, rows)
            return
        if t == 2:  # a cast and a shift run at memory speed; a strided byte copy is ~3x slower
            words = rows[:, : 2 * m].view("<u2")
            np.copyto(out[:, :m], words, casting="unsafe")  # low bytes
            np.right_shift(words, 8, out=out[:, m : 2 * m], casting="unsafe")  # high bytes
        else:
            np.copyto(out[:, : m * t].reshape(-1, t, m), rows[:, : m * t].reshape(-1, m, t).transpose(0, 2, 1))
        if size > m * t:
            np.copyto(out[:, m * t :], rows[:, m * t :])

    @staticmethod
    def _memcpyed(src: np.ndarray, header: bytes, out: np.ndarray) -> int:
        out[:OVERHEAD] = np.frombuffer(header, np.uint8)
        out[OVERHEAD : OVERHEAD + src.nbytes] = src
        return OVERHEAD + src.nbytes


def memcpyed_header(nbytes: int, typesize: int, blocksize: int) -> bytes | None:
    """The 16-byte header c-blosc gives an uncompressed (clevel 0, memcpyed) frame of `nbytes`, or None if
    its frame is not that header + the raw bytes.

    It depends only on the size, typesize and flags, so `header + raw bytes` is exactly what c-blosc would
    write for any content: every blosc decoder, zarr's included, reads it."""
    zeros = np.zeros(nbytes, np.uint8)
    frame = _blosc_encode(zeros, typesize, blocksize, clevel=0)
    if len(frame) != nbytes + OVERHEAD or frame[OVERHEAD:] != zeros.tobytes():
        return None
    return frame[:OVERHEAD]


def _blosc_encode(raw_u8: np.ndarray, typesize: int, blocksize: int, clevel: int = 1) -> bytes:
    from numcodecs import Blosc

    as_items = raw_u8.view(f"u{typesize}") if typesize in (1, 2, 4, 8) else raw_u8
    if as_items.dtype.itemsize != typesize:
        raise ValueError(f"typesize {typesize} is not one eagle-batch stores")
    return bytes(Blosc(cname="zstd", clevel=clevel, shuffle=Blosc.SHUFFLE, blocksize=blocksize).encode(as_items))

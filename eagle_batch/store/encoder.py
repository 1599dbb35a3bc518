"""ChunkEncoder: compress one inner chunk into a buffer the store owns, the GIL released throughout.

numcodecs' `Blosc.encode` / `Zstd.encode` compress without the GIL, but then trim their result with
`dest[:cbytes]`: a fresh bytes object and a copy of the whole encoded chunk (~3 MB for a 4 MiB chunk of
bf16 states) made while holding the GIL, plus page faults on the new allocation. Every compression thread
pays that copy in series with the capture's other threads (docs/decisions/0016 measures how much of an
encode holds the GIL each way).

So the store calls the same C functions numcodecs ships (`blosc_compress_ctx` from its blosc extension,
`ZSTD_compress` from its zstd extension) through ctypes, which drops the GIL for the call, writing into
a reused buffer. Both are checked at construction to produce byte-identical output to numcodecs on a
test buffer; where a symbol is missing or the output differs (another numcodecs build), the encoder
falls back to numcodecs' own `encode` and says so in `direct`. The on-disk format does not change.

With `entropy_only` (store.entropy_only, the default) a blosc-zstd chunk is instead framed by
`BloscFrameWriter` (blosc_frame.py): the same blosc frame format, zstd asked only for what pays on bf16
states (Huffman-coded exponent bytes), far faster at the same ratio (docs/decisions/0012). It is checked at
construction to decode back to its input through numcodecs; where it does not, the c-blosc path above is
used and `why_not_entropy` says why.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .blosc_frame import BloscFrameWriter, zstd_is_error
from .format import Codec

BLOSC_MAX_OVERHEAD = 16


def _blosc_fn():
    from numcodecs import blosc

    fn = ctypes.CDLL(blosc.__file__).blosc_compress_ctx
    fn.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_int,
    ]
    fn.restype = ctypes.c_int
    return fn


def _zstd_fns():
    from numcodecs import zstd

    lib = ctypes.CDLL(zstd.__file__)
    fn, bound = lib.ZSTD_compress, lib.ZSTD_compressBound
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_size_t
    bound.argtypes = [ctypes.c_size_t]
    bound.restype = ctypes.c_size_t
    return fn, bound


def _test_chunk(itemsize: int) -> np.ndarray:
    # Compressible and incompressible parts, like bf16 states: a smooth exponent byte, noisy mantissa.
    rng = np.random.default_rng(7)
    vals = rng.standard_normal(96 << 10).astype(np.float32).view(np.uint32) >> 16
    raw = vals.astype(np.uint16).view(np.uint8)
    return np.frombuffer(raw[: (raw.nbytes // itemsize) * itemsize].tobytes(), dtype=f"u{itemsize}")


class ChunkEncoder:
    """Encodes one contiguous chunk into `out` (a uint8 buffer of at least `bound(chunk.nbytes)`)."""

    def __init__(self, codec: Codec, itemsize: int, entropy_only: bool = False):
        self.codec = codec
        self._numcodec = codec.numcodec()
        self._fn = None
        self._bound = None
        self._frames: BloscFrameWriter | None = None
        self.direct = False
        self.why_not_direct = ""
        self.why_not_entropy = "" if entropy_only and codec.name == "blosc-zstd" else "not asked for"
        if self._numcodec is None:  # codec "none": the bytes themselves, copied by numpy without the GIL
            self.direct = True
            return
        try:
            if codec.name == "blosc-zstd":
                self._fn = _blosc_fn()
            elif codec.name == "zstd":
                self._fn, self._bound = _zstd_fns()
            test = _test_chunk(itemsize)
            out = np.empty(self.bound(test.nbytes), np.uint8)
            got = bytes(out[: self._encode_direct(test, out)])
            want = bytes(self._numcodec.encode(test))
            if got != want:
                raise ValueError("output differs from numcodecs' on the test chunk")
            self.direct = True
        except (AttributeError, OSError, ValueError, RuntimeError) as e:
            self._fn = None
            self.why_not_direct = f"{type(e).__name__}: {e}"
        if not self.why_not_entropy:
            try:
                self._frames = _checked_frame_writer(codec, itemsize)
                self.direct = True  # frames are written into the caller's buffer too
            except (AttributeError, OSError, ValueError, RuntimeError, MemoryError) as e:
                self.why_not_entropy = f"{type(e).__name__}: {e}"

    def bound(self, nbytes: int) -> int:
        """The most bytes one chunk of `nbytes` raw bytes can encode to."""
        if self.codec.name == "blosc-zstd":
            return nbytes + BLOSC_MAX_OVERHEAD
        if self._bound is not None:  # zstd
            return int(self._bound(nbytes))
        return nbytes  # codec none (or zstd without the direct path, which allocates no buffers)

    @property
    def identity(self) -> bool:
        """Encoded bytes are the raw bytes (codec none)."""
        return self._numcodec is None

    @property
    def entropy_only(self) -> bool:
        return self._frames is not None

    def _encode_direct(self, chunk: np.ndarray, out: np.ndarray) -> int:
        if self._frames is not None:
            return self._frames.encode(chunk, out)
        src, dst, n, cap = chunk.ctypes.data, out.ctypes.data, chunk.nbytes, out.nbytes
        if self.codec.name == "blosc-zstd":
            c = self.codec
            got = self._fn(c.level, 1, chunk.dtype.itemsize, n, src, dst, cap, b"zstd", c.blocksize, 1)
            if got <= 0:
                raise RuntimeError(f"blosc compression failed ({got})")
            return got
        got = self._fn(dst, cap, src, n, self.codec.level)
        if zstd_is_error(got):
            raise RuntimeError(f"zstd compression failed (code {got})")
        return got

    def encode(self, chunk: np.ndarray, out: np.ndarray | None):
        """The encoded bytes: a view of `out` on the direct path (`out` None: a new bytes object)."""
        if out is None and self._frames is not None:  # one-off chunks (a tail): the same frames, a new buffer
            out = np.empty(self.bound(chunk.nbytes), np.uint8)
            return bytes(out[: self._encode_direct(np.ascontiguousarray(chunk), out)])
        if out is None or not self.direct:
            return chunk.tobytes() if self._numcodec is None else bytes(self._numcodec.encode(chunk))
        if not chunk.flags.c_contiguous:
            chunk = np.ascontiguousarray(chunk)
        if self._numcodec is None:
            flat = out[: chunk.nbytes]
            np.copyto(flat, chunk.reshape(-1).view(np.uint8))
            return memoryview(flat)
        return memoryview(out)[: self._encode_direct(chunk, out)]


def _checked_frame_writer(codec: Codec, itemsize: int) -> BloscFrameWriter:
    """A frame writer (one block per chunk) whose frames numcodecs' blosc decodes back to the test chunk, or
    an error saying why not."""
    frames = BloscFrameWriter(None, itemsize, level=codec.level)
    test = _test_chunk(itemsize)
    out = np.empty(test.nbytes + BLOSC_MAX_OVERHEAD, np.uint8)
    got = bytes(out[: frames.encode(test, out)])
    if bytes(codec.numcodec().decode(got)) != test.tobytes():
        raise ValueError("numcodecs' blosc does not decode the frames back to their input")
    return frames

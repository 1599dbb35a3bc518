"""FP8 hidden states (store.dtype float8_e4m3 | float8_e5m2): float8 codes with one float32 scale per row
(token x layer).

The one definition of the quantization (the capture's device version, capture/fp8.py, gives the same bits),
for an encoding `f8` (E4M3: `float8_e4m3fn`, MAX 448; E5M2: `float8_e5m2`, MAX 57344; format.FLOAT8_ENCODINGS):

    x[t, l, :]   the bf16 states of token t, layer l, exact in float32
    scale[t, l]  = max_h |x[t, l, h]| / MAX          float32; MAX is the encoding's largest finite value
    code         = f8(clip(x / scale, -MAX, MAX))    round to nearest even; a row of zeros: scale 0, codes 0

and of the dequantization, `value = f8(code) * scale` in float32, rounded to bf16 by the reader.
E4M3 keeps 3 mantissa bits, so a value in its normal range (down to 2^-6 / 448 of its row's largest) comes
back within 2^-4 relative; E5M2 keeps 2 (within 2^-3) over a far wider range (down to 2^-14 / 57344), and its
codes carry about one bit less entropy, which the store's lossless coder turns into ~15% fewer bytes
(docs/decisions/0020). A row scale rather than one per block of channels was chosen by measurement on real
states (0020). Neither encoding is given infinities (the clip): a store of float8 states holds finite values
only (NaN/Inf rows are refused at append).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import ml_dtypes
import numpy as np

from .format import BF16, FLOAT8_ENCODINGS


@dataclass(frozen=True)
class Float8:
    """One float8 encoding as a store uses it: `dtype` the store.dtype, `encoding` the ml_dtypes / torch name."""

    dtype: str
    encoding: str
    max: float

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(getattr(ml_dtypes, self.encoding))

    @property
    def values(self) -> np.ndarray:
        """Every code's value, float32 [256] (NaN and Inf codes included): dequantization is a table lookup."""
        return _values(self.encoding)

    @property
    def smallest_normal(self) -> float:
        """The smallest normal value: below `smallest_normal / max` of its row's largest, a value loses bits."""
        return float(ml_dtypes.finfo(self.np_dtype).smallest_normal)

    @property
    def mantissa_bits(self) -> int:
        return int(ml_dtypes.finfo(self.np_dtype).nmant)


@cache
def _values(encoding: str) -> np.ndarray:
    table = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, encoding)).astype(np.float32)
    table.flags.writeable = False
    return table


def float8(dtype: str) -> Float8:
    """The encoding of store.dtype `dtype` (a float8 one; ValueError otherwise)."""
    try:
        encoding, top = FLOAT8_ENCODINGS[dtype]
    except KeyError:
        raise ValueError(f"{dtype!r} is not a float8 store.dtype; use one of {', '.join(FLOAT8_ENCODINGS)}") from None
    return Float8(dtype, encoding, top)


def float8_for_encoding(encoding: str) -> Float8:
    """The float8 store.dtype whose codes are `encoding` (a hidden_states array's attribute)."""
    for dtype, (enc, _) in FLOAT8_ENCODINGS.items():
        if enc == encoding:
            return float8(dtype)
    raise ValueError(f"unknown float8 encoding {encoding!r}; this eagle-batch reads {sorted(FLOAT8_ENCODINGS)}")


E4M3 = float8("float8_e4m3")
E5M2 = float8("float8_e5m2")


@dataclass(frozen=True)
class Fp8Rows:
    """Hidden states as a float8 store keeps them: `codes` uint8 [T, L, H] (float8 bit patterns) and `scales`
    float32 [T, L]. What the capture hands a float8 store after quantizing on the device."""

    codes: np.ndarray
    scales: np.ndarray

    def __post_init__(self) -> None:
        if self.codes.dtype != np.uint8 or self.scales.dtype != np.float32:
            raise TypeError(
                f"Fp8Rows: codes must be uint8 and scales float32, got {self.codes.dtype}, {self.scales.dtype}"
            )
        if self.codes.ndim != 3 or self.scales.shape != self.codes.shape[:2]:
            raise ValueError(
                f"Fp8Rows: codes {self.codes.shape} and scales {self.scales.shape} are not [T, L, H], [T, L]"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        return self.codes.shape

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes

    def __len__(self) -> int:
        return len(self.codes)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32, exact."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


QUANTIZE_PIECE_BYTES = 1 << 20  # bf16 bytes quantized per pass: its float32 temporaries stay in cache


def quantize(bits: np.ndarray, f8: Float8) -> Fp8Rows:
    """bf16 states [T, L, H] (uint16 bits) -> codes and row scales in encoding `f8` (module docstring). NaN/Inf
    states give non-finite scales: callers check `np.isfinite(rows.scales)`."""
    codes = np.empty(bits.shape, np.uint8)
    scales = np.empty(bits.shape[:2], np.float32)
    top, enc = np.float32(f8.max), f8.np_dtype
    step = max(1, QUANTIZE_PIECE_BYTES // max(1, bits[0].nbytes if len(bits) else 1))
    for s in range(0, len(bits), step):
        x = bf16_to_f32(bits[s : s + step])
        sc = np.abs(x).max(axis=-1) / top
        q = x / np.where(sc > 0, sc, np.float32(1))[..., None]
        np.clip(q, -top, top, out=q)
        codes[s : s + step] = q.astype(enc).view(np.uint8)
        scales[s : s + step] = sc
    return Fp8Rows(codes, scales)


def dequantize_f32(codes: np.ndarray, scales: np.ndarray, f8: Float8) -> np.ndarray:
    """codes [..., H] and scales [...] -> float32 values."""
    out = f8.values[codes]
    out *= scales[..., None]
    return out


def dequantize(codes: np.ndarray, scales: np.ndarray, f8: Float8) -> np.ndarray:
    """codes [..., H] and scales [...] -> bf16 bits (uint16): `dequantize_f32` rounded to nearest even.

    A row's 256 possible results are computed once (the same float32 products, rounded), then looked up: a
    uint16 table gather per row instead of a float32 gather, multiply and bf16 rounding per value."""
    with np.errstate(invalid="ignore"):  # Inf codes x a zero row's scale 0: NaN entries no stored code selects
        tables = (f8.values * scales.reshape(-1, 1)).astype(BF16).view(np.uint16)  # [rows, 256]
    out = np.empty(codes.shape, np.uint16)
    H = codes.shape[-1]
    for table, row, dst in zip(tables, codes.reshape(-1, H), out.reshape(-1, H)):
        np.take(table, row, out=dst)
    return out


def special_codes(codes: np.ndarray, f8: Float8) -> tuple[int, int]:
    """(NaN codes, Inf codes) among `codes` in encoding `f8`; the quantization writes neither for finite states."""
    counts = np.bincount(codes.reshape(-1), minlength=256)
    return int(counts[np.isnan(f8.values)].sum()), int(counts[np.isinf(f8.values)].sum())

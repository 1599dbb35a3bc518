"""FP8 hidden states (store.dtype float8_e4m3): OCP E4M3 codes with one float32 scale per row (token x layer).

The one definition of the quantization (the capture's device version, capture/fp8.py, gives the same bits):

    x[t, l, :]   the bf16 states of token t, layer l, exact in float32
    scale[t, l]  = max_h |x[t, l, h]| / 448          float32; 448 is the largest finite E4M3 value
    code         = e4m3fn(clip(x / scale, -448, 448))  round to nearest even; a row of zeros: scale 0, codes 0

and of the dequantization, `value = e4m3fn(code) * scale` in float32, rounded to bf16 by the reader.
E4M3 has 3 mantissa bits, so a value in its normal range (down to 2^-6 / 448 of its row's largest) comes
back within 2^-4 relative; smaller values lose bits to the subnormals. A row scale rather than one per block
of channels was chosen by measurement on real states (docs/decisions/0020). E4M3 has no infinity: a store of
float8 states holds finite values only (NaN/Inf rows are refused at append).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .format import BF16

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E4M3_MAX = 448.0
# Every code's value (0x7F and 0xFF are NaN): dequantization is a table lookup.
E4M3_VALUES = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32)


@dataclass(frozen=True)
class Fp8Rows:
    """Hidden states as a float8 store keeps them: `codes` uint8 [T, L, H] (E4M3 bit patterns) and `scales`
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


def quantize(bits: np.ndarray) -> Fp8Rows:
    """bf16 states [T, L, H] (uint16 bits) -> codes and row scales (module docstring). NaN/Inf states give
    non-finite scales: callers check `np.isfinite(rows.scales)`."""
    codes = np.empty(bits.shape, np.uint8)
    scales = np.empty(bits.shape[:2], np.float32)
    step = max(1, QUANTIZE_PIECE_BYTES // max(1, bits[0].nbytes if len(bits) else 1))
    for s in range(0, len(bits), step):
        x = bf16_to_f32(bits[s : s + step])
        sc = np.abs(x).max(axis=-1) / np.float32(E4M3_MAX)
        q = x / np.where(sc > 0, sc, np.float32(1))[..., None]
        np.clip(q, -E4M3_MAX, E4M3_MAX, out=q)
        codes[s : s + step] = q.astype(E4M3).view(np.uint8)
        scales[s : s + step] = sc
    return Fp8Rows(codes, scales)


def dequantize_f32(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """codes [..., H] and scales [...] -> float32 values."""
    out = E4M3_VALUES[codes]
    out *= scales[..., None]
    return out


def dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """codes [..., H] and scales [...] -> bf16 bits (uint16): `dequantize_f32` rounded to nearest even.

    A row's 256 possible results are computed once (the same float32 products, rounded), then looked up: a
    uint16 table gather per row instead of a float32 gather, multiply and bf16 rounding per value."""
    tables = (E4M3_VALUES * scales.reshape(-1, 1)).astype(BF16).view(np.uint16)  # [rows, 256]
    out = np.empty(codes.shape, np.uint16)
    H = codes.shape[-1]
    for table, row, dst in zip(tables, codes.reshape(-1, H), out.reshape(-1, H)):
        np.take(table, row, out=dst)
    return out


def nan_codes(codes: np.ndarray) -> int:
    """How many codes are E4M3's NaN (0x7F, 0xFF); the quantization never writes one for finite states."""
    return int(((codes & 0x7F) == 0x7F).sum())

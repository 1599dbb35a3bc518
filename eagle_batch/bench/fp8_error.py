"""The error of float8 hidden states against the bf16 ones, per layer (what `bench store` reports).

For states x (bf16, as the model gave them) and d (what a reader gets back: dequantized, rounded to bf16),
per layer over all rows (token x layer, a row being one layer's H values of one token):

- `cosine_mean`, `cosine_min`: cos(d, x) per row;
- `rel_l2_mean`, `rel_l2_max`: ||d - x|| / ||x|| per row;
- `max_rel_err`: max |d - x| / |x| over every nonzero element; 1.0 wherever a value far below its row's
  largest was flushed to zero, so also
- `max_rel_err_normal`: the same over the elements the encoding holds in its normal range (|x| >= its smallest
  normal x the row's scale: 2^-6 for E4M3, 2^-14 for E5M2), where m mantissa bits bound it by 2^-(m+1) (plus
  bf16's rounding of the result), and
- `below_normal_fraction`: the share of nonzero elements under that range (subnormal or flushed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from eagle_batch.store.fp8 import Float8, bf16_to_f32, dequantize, quantize

METRICS = (
    "cosine_mean",
    "cosine_min",
    "rel_l2_mean",
    "rel_l2_max",
    "max_rel_err",
    "max_rel_err_normal",
    "below_normal_fraction",
)


def row_errors(x: np.ndarray, d: np.ndarray, normal_min: np.ndarray) -> dict[str, float]:
    """The metrics (module docstring) of rows x [N, H] against d [N, H]; `normal_min`: the smallest magnitude in
    the encoding's normal range, broadcast to x ([N, 1]: per row; [N, H]: per element, for scales per block)."""
    x, d = x.astype(np.float64), d.astype(np.float64)
    nx, nd = np.linalg.norm(x, axis=1), np.linalg.norm(d, axis=1)
    ok = nx > 0
    cos = (x * d).sum(1)[ok] / np.maximum(nx * nd, 1e-300)[ok]
    rel_l2 = np.linalg.norm(d - x, axis=1)[ok] / nx[ok]
    nz = x != 0
    rel = np.abs(d - x)[nz] / np.abs(x)[nz]
    normal = np.abs(x) >= normal_min
    rel_normal = np.abs(d - x)[normal & nz] / np.abs(x)[normal & nz]
    return {
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "rel_l2_mean": float(rel_l2.mean()),
        "rel_l2_max": float(rel_l2.max()),
        "max_rel_err": float(rel.max()) if rel.size else 0.0,
        "max_rel_err_normal": float(rel_normal.max()) if rel_normal.size else 0.0,
        "below_normal_fraction": float((nz & ~normal).sum() / max(1, nz.sum())),
    }


def layer_errors(bits: np.ndarray, layer_ids: Sequence[int], f8: Float8) -> dict:
    """Per-layer metrics of the store's float8 `f8` (row scales) against bf16 states `bits` [N, L, H] (uint16)."""
    q = quantize(bits, f8)
    d = bf16_to_f32(dequantize(q.codes, q.scales, f8))
    x = bf16_to_f32(bits)
    per = [row_errors(x[:, j], d[:, j], q.scales[:, j, None] * f8.smallest_normal) for j in range(len(layer_ids))]
    return {"layer_ids": list(layer_ids), **{m: [round(p[m], 6) for p in per] for m in METRICS}}

"""Float8 hidden states on the capture side (a float8 store.dtype): quantized where they are computed.

The connector quantizes a step's gathered bf16 rows on their device, before the device-to-host copy, which
then moves half the bytes: `pack` gives one uint8 row per token, its L*H float8 codes followed by its L float32
row scales (little endian), so every transport carries the record as plain [tokens, row bytes] rows like any
other. The writer thread turns a request's rows back into the store's `Fp8Rows` (`unpack`, views, no copy).
The arithmetic is the store's definition (eagle_batch/store/fp8.py) step for step, with true float32
divisions (a division by a Python scalar may run as a multiplication by its reciprocal), so the codes and
scales are the bits the store would compute from the same bf16 states; tests/capture/test_fp8_pack.py
compares them.
"""

from __future__ import annotations

import numpy as np
import torch

from eagle_batch.store.fp8 import Float8, Fp8Rows

# Tokens quantized per pass: bounds the float32 temporary on the device (1024 x 4 x 7168 x 4 B = 117 MB).
PASS_TOKENS = 1024


def packed_row_nbytes(num_layers: int, hidden_size: int) -> int:
    return num_layers * hidden_size + 4 * num_layers


def pack(rows: torch.Tensor, f8: Float8) -> torch.Tensor:
    """[N, L, H] on any device -> uint8 [N, L*H + 4*L] on the same device: codes in encoding `f8`, then row
    scales. States of another dtype (a float32 engine) are rounded to bf16 first, as a bfloat16 store would
    keep them."""
    n, L, H = rows.shape
    top, encoding = f8.max, getattr(torch, f8.encoding)
    out = torch.empty((n, packed_row_nbytes(L, H)), dtype=torch.uint8, device=rows.device)
    for s in range(0, n, PASS_TOKENS):
        x = rows[s : s + PASS_TOKENS].to(torch.bfloat16).float()
        amax = x.abs().amax(-1)
        scales = amax / torch.full_like(amax, top)
        div = torch.where(scales > 0, scales, torch.ones_like(scales))
        q = (x / div.unsqueeze(-1)).clamp_(-top, top)
        m = len(x)
        out[s : s + m, : L * H] = q.to(encoding).view(torch.uint8).view(m, L * H)
        out[s : s + m, L * H :] = scales.contiguous().view(torch.uint8).view(m, 4 * L)
    return out


def unpack(packed: np.ndarray, num_layers: int, hidden_size: int) -> Fp8Rows:
    """A request's packed rows (uint8 [T, L*H + 4*L]) as the store's codes [T, L, H] and scales [T, L]:
    views of `packed` (the codes are strided: the store copies them into its chunk buffers)."""
    L, H = num_layers, hidden_size
    if packed.ndim != 2 or packed.shape[1] != packed_row_nbytes(L, H):
        raise ValueError(
            f"float8 rows of shape {packed.shape}, expected [tokens, {packed_row_nbytes(L, H)}] for {L} layers of {H}"
        )
    n = len(packed)
    return Fp8Rows(packed[:, : L * H].reshape(n, L, H), packed[:, L * H :].view(np.float32))

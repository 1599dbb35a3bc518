"""Shared helpers for store tests: deterministic synthetic samples and a small layout (many shards, few bytes)."""

from __future__ import annotations

import numpy as np
from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec

LAYERS = [1, 3, 4]
HIDDEN = 24


def make_sample(seed: int, max_len: int = 70):
    """(sample_id, input_ids int32, loss_mask uint8, hidden_states uint16 bits [T, L, H]) from a seed."""
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, max_len))
    ids = rng.integers(0, 50000, t).astype(np.int32)
    mask = rng.integers(0, 2, t).astype(np.uint8)
    # Normal-ish bf16 values: the top 16 bits of float32 normals (plus an outlier channel, like real states).
    f = rng.standard_normal((t, len(LAYERS), HIDDEN)).astype(np.float32)
    f[:, :, 3] *= 300.0
    hs = (f.view(np.uint32) >> 16).astype(np.uint16)
    return f"sample-{seed:05d}", ids, mask, hs



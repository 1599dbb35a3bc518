"""Helpers of the interop tests (a module of its own, not conftest.py, so test modules can import them
whichever conftest pytest loaded last): synthetic samples, a complete task store, the layout constants."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LAYERS = [2, 3, 4, 6]  # 3 aux layer ids + the last layer N
N_LAYERS = 6
HIDDEN = 32
VOCAB = 300
EPS = 1e-5


def make_samples(n: int, seed: int = 0) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(sample_id, input_ids int32, loss_mask uint8, hidden_states uint16 bf16 bits [T, L, H]); lengths
    cross the test layout's 16-token chunks and 64-token shards."""
    g = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = int(g.integers(5, 90))
        ids = g.integers(0, VOCAB, t).astype(np.int32)
        mask = (g.random(t) < 0.6).astype(np.uint8)
        scale = (1 + np.arange(len(LAYERS)))[:, None]  # each layer its own magnitude: a swapped layer shows
        f = (g.standard_normal((t, len(LAYERS), HIDDEN)) * scale).astype(np.float32)
        out.append((f"s{i:03d}", ids, mask, (f.view(np.uint32) >> 16).astype(np.uint16)))
    return out


def write_store(path: Path, samples, num_hidden_layers: int = N_LAYERS) -> Path:
    from eagle_batch.config import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    spec = StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN, model_name="fake", num_hidden_layers=num_hidden_layers)
    w = TaskStoreWriter.open(path, spec, StoreConfig(chunk_tokens=16, shard_tokens=64, fsync=False))
    for sid, ids, mask, hs in samples:
        w.append(sid, ids, mask, hs)
    w.commit()
    w.finalize()
    w.close()
    return path

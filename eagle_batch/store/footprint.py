"""A task store's bytes per token on disk, raw and at the best compression measured: what the extraction's
disk check (launch/disk_room.py) needs to know before anything is submitted.

Raw: every token array of `store.dtype` (format.array_dtypes): hidden states `layers x hidden` elements
(plus a float32 scale per layer for float8), the token id and the loss-mask byte. Compressed: the codecs'
ratio depends on the states and, with `store.adaptive`, on the CPU a node has spare (a busy node stores
chunks raw), so the check counts on the highest ratio measured on chat hidden states, never a typical one:
bf16 1.41-1.61x (the README demo's chat states 1.609 with the entropy-only frames, docs/decisions/0012;
SmolLM2's ShareGPT states on the H200 1.42x), float8 codes of SmolLM2 states 1.17x (E4M3) and 1.37x (E5M2)
(docs/reference/store-format.md, "FP8 hidden states"). A store that needs more than the space left cannot fit; one that fits
only compressed may not.
"""

from __future__ import annotations

from .format import SCALE_ARRAY, ZARR_NP, array_dtypes

BEST_RATIO = {"bfloat16": 1.6, "float8_e4m3": 1.2, "float8_e5m2": 1.4}


def raw_bytes_per_token(num_layers: int, hidden_size: int, dtype: str) -> int:
    """Uncompressed bytes of one token in a store of `dtype` (store.dtype) with `num_layers` captured layers."""
    per_layer = {"hidden_states": hidden_size, SCALE_ARRAY: 1}
    return sum(
        ZARR_NP[zarr_dtype].itemsize * (num_layers * per_layer[name] if name in per_layer else 1)
        for name, zarr_dtype in array_dtypes(dtype).items()
    )


def least_bytes_per_token(num_layers: int, hidden_size: int, dtype: str, codec: str) -> float:
    """The fewest bytes a token has taken on disk in a store of these settings (raw when uncompressed)."""
    raw = raw_bytes_per_token(num_layers, hidden_size, dtype)
    return raw if codec == "none" else raw / BEST_RATIO[dtype]

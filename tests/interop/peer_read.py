"""Read an export with the peer trainer's own dataset class; save what it returns (run by test_peer_readers.py
in a subprocess whose path starts with .venv-peers, where the peers are installed without dependencies).

    python peer_read.py speculators|specforge OUT RESULT.pt
"""

from __future__ import annotations

import sys

import torch


def _package_without_init(name: str) -> None:
    """Register package `name` without running its __init__ (speculators' imports every draft model through
    transformers: ~6 s on 2 cores); its submodules then import as they are, unchanged."""
    import importlib.util
    import types

    spec = importlib.util.find_spec(name)
    pkg = types.ModuleType(name)
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = pkg


def speculators(out: str) -> list[dict]:
    _package_without_init("speculators")
    from datasets import load_from_disk
    from speculators.train.data import ArrowDataset

    # on_missing="raise": a missing hs_{i} file fails here instead of asking a vLLM server for it.
    ds = ArrowDataset(max_len=4096, datapath=out, on_missing="raise", train_ratio=1.0)
    rows = load_from_disk(out)
    return [{**ds[i], "sample_id": rows[i]["sample_id"], "approx_len": ds.approx_lengths[i]} for i in range(len(ds))]


def specforge(out: str) -> list[dict]:
    from specforge.data.preprocessing import build_offline_eagle3_dataset

    ds = build_offline_eagle3_dataset(out, max_len=4096)
    return [{**ds[i], "path": ds.datapaths[i]} for i in range(len(ds))]


if __name__ == "__main__":
    fmt, out, dest = sys.argv[1:4]
    items = {"speculators": speculators, "specforge": specforge}[fmt](out)
    torch.save([{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in x.items()} for x in items], dest)
    print(f"{fmt}: {len(items)} samples read")

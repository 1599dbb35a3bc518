"""Fixtures of the interop tests: a small complete task store (layers [2, 3, 4, 6] of a 6-layer target, N
recorded) and a fake target folder (config.json and a non-trivial final norm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from interop_testlib import EPS, HIDDEN, N_LAYERS, VOCAB, make_samples, write_store


@pytest.fixture
def samples():
    return make_samples(12)


@pytest.fixture
def store(tmp_path, samples) -> Path:
    return write_store(tmp_path / "task-00000.zarr", samples)


@pytest.fixture
def target(tmp_path) -> Path:
    """config.json (6 layers, rms_norm_eps) and a final norm weight far from ones, so applying it shows."""
    import torch
    from safetensors.torch import save_file

    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"num_hidden_layers": N_LAYERS, "hidden_size": HIDDEN, "vocab_size": VOCAB, "rms_norm_eps": EPS})
    )
    w = (torch.linspace(0.5, 2.0, HIDDEN)).to(torch.bfloat16)
    save_file({"model.norm.weight": w}, str(d / "model.safetensors"))
    return d

"""Fixtures for the train tests: a tiny fake target (config + embedding/norm/lm_head only) and data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

TINY = dict(hidden=64, vocab=512, layers=6, heads=4, kv_heads=2, head_dim=16, inter=128)
TINY_LAYERS = [2, 3, 4, 6]  # 3 aux layer ids + the last layer N=6


def write_fake_target(dest: Path, seed: int = 0) -> Path:
    """The parts of a target the trainer reads: config.json and embed / final norm / lm_head weights."""
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    t = TINY
    (dest / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": t["hidden"],
                "intermediate_size": t["inter"],
                "num_hidden_layers": t["layers"],
                "num_attention_heads": t["heads"],
                "num_key_value_heads": t["kv_heads"],
                "head_dim": t["head_dim"],
                "vocab_size": t["vocab"],
                "rms_norm_eps": 1e-5,
                "max_position_embeddings": 1024,
                "rope_theta": 10000.0,
                "tie_word_embeddings": False,
            }
        )
    )
    g = torch.Generator().manual_seed(seed)
    save_file(
        {
            "model.embed_tokens.weight": torch.randn(t["vocab"], t["hidden"], generator=g).to(torch.bfloat16),
            "model.norm.weight": torch.ones(t["hidden"], dtype=torch.bfloat16),
            "lm_head.weight": torch.randn(t["vocab"], t["hidden"], generator=g).to(torch.bfloat16),
        },
        str(dest / "model.safetensors"),
    )
    return dest


@pytest.fixture
def fake_target(tmp_path) -> Path:
    return write_fake_target(tmp_path / "target")


@pytest.fixture
def tiny_dataset():
    from helpers import random_samples

    from eagle_batch.train.data import InMemoryDataset

    return InMemoryDataset(random_samples(40, TINY_LAYERS, TINY["hidden"], TINY["vocab"]), TINY_LAYERS)


def tiny_cfg(run_dir: Path, target: Path, *overrides: str):
    from eagle_batch.config import load_config

    return load_config(
        None,
        [
            f"run_dir={run_dir}",
            f"model.path={target}",
            "train.steps=6",
            "train.batch_tokens=256",
            "train.num_workers=0",
            "train.log_every=1",
            "train.draft_vocab_size=128",
            "train.ttt_steps=3",
            "train.checkpoint_every=2",
            "train.warmup_steps=2",
            "train.tensorboard=false",
            "train.precision=fp32",
            *overrides,
        ],
    )

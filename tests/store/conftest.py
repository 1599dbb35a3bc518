"""Fixtures for store tests (helpers live in store_testlib.py so test modules and scripts can import them)."""

from __future__ import annotations

import pytest
from store_testlib import HIDDEN, LAYERS

from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec


@pytest.fixture
def spec() -> StoreSpec:
    return StoreSpec(
        layer_ids=LAYERS,
        hidden_size=HIDDEN,
        model_name="synthetic",
        model_revision="r1",
        tokenizer="tok",
        config_hash="abc123",
    )


@pytest.fixture
def small_cfg() -> StoreConfig:
    # 8-token chunks in 32-token shards: a handful of samples already spans several shards. Adaptive off:
    # every chunk compressed, so shard bytes are deterministic (test_adaptive.py covers raw chunks).
    return StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=False)

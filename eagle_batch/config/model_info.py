"""What we need to know about the target model, read from its config.json (no weights loaded).

Layer-id semantics live here and in `eagle_batch/capture/layers.py`: id k is the residual stream after
k decoder layers (transformers' `output_hidden_states[k]`); id N (= num_hidden_layers) is the last
layer's output BEFORE the final norm.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .load import ConfigError
from .schema import ModelConfig


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    model_type: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    # The longest sequence the model's positions cover without rope scaling (0 = not stated, or rope scaling
    # set: then vLLM derives a longer limit itself and we do not guess it).
    max_positions: int = 0
    rms_norm_eps: float = 1e-6  # the final norm's epsilon (the config's `rms_norm_eps`)


def _text_config(cfg: dict) -> dict:
    # Vision-language wrappers (Kimi-K2.5, Llava, Qwen-VL ...) keep the language model's shape in a
    # nested text config.
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(cfg.get(key), dict) and "num_hidden_layers" in cfg[key]:
            return cfg[key]
    return cfg


def model_info(model_path: str | Path) -> ModelInfo:
    p = Path(model_path) / "config.json"
    if not p.is_file():
        raise ConfigError(
            f"model.path={model_path}: no config.json there; point model.path at a local "
            "Hugging Face model folder (config.json, weights, tokenizer)."
        )
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not valid JSON ({e}).") from e
    tc = _text_config(raw)
    missing = [k for k in ("num_hidden_layers", "hidden_size") if k not in tc]
    if missing:
        raise ConfigError(f"{p}: missing {', '.join(missing)}; is this a decoder-only LLM config?")
    heads = int(tc.get("num_attention_heads", 0) or 0)
    return ModelInfo(
        architecture=(raw.get("architectures") or ["?"])[0],
        model_type=str(raw.get("model_type", tc.get("model_type", "?"))),
        num_hidden_layers=int(tc["num_hidden_layers"]),
        hidden_size=int(tc["hidden_size"]),
        vocab_size=int(tc.get("vocab_size", raw.get("vocab_size", 0)) or 0),
        num_attention_heads=heads,
        num_key_value_heads=int(tc.get("num_key_value_heads", heads) or heads),
        max_positions=0 if tc.get("rope_scaling") else int(tc.get("max_position_embeddings", 0) or 0),
        rms_norm_eps=float(tc.get("rms_norm_eps", 1e-6)),
    )


# The files that define a tokenizer's behaviour, in the order they are hashed (those absent are skipped).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)


def tokenizer_sha256(folder: str | Path) -> str:
    """A tokenizer's identity independent of where it lies: sha256 over `<name>\n<sha256 of its bytes>\n`
    for each of TOKENIZER_FILES present in `folder` ("" when none is)."""
    h = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        f = Path(folder) / name
        if f.is_file():
            found = True
            h.update(f"{name}\n{hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest() if found else ""


def default_layer_ids(num_hidden_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high aux layers plus the last layer (verifier's last hidden state)."""
    n = num_hidden_layers
    ids = [2, n // 2, n - 3, n]
    # Tiny models (n < 6) would produce duplicates, negatives or a descending pair (n=4: 2 then 1): clamp,
    # drop repeats, ascending (check_layer_ids says why).
    return sorted({min(max(i, 0), n) for i in ids})


def check_layer_ids(ids: list[int], n: int, key: str = "layer_ids") -> list[int]:
    """The one check of a layer-id list against a model with `n` decoder layers; errors name `key`."""
    if not ids:
        raise ConfigError(
            f"{key} is empty; give at least one layer id (the EAGLE-3 default for this model "
            f"is {default_layer_ids(n)})."
        )
    bad = [i for i in ids if i < 0 or i > n]
    if bad:
        raise ConfigError(
            f"{key}={ids}: ids {bad} are outside 0..{n} (the model has {n} "
            f"decoder layers; id {n} is the last layer's output before the final norm)."
        )
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{key}={ids} repeats ids; list each layer once.")
    if ids != sorted(ids):
        # vLLM's models append the aux hidden states while walking their layers, so the native capture and
        # an EAGLE-3 draft served by vLLM both see them in layer order; a store labelled in another order
        # would name every column wrongly (seen on Kimi-K2.5 with [2, 1, 4]: native and hooks disagreed).
        raise ConfigError(
            f"{key}={ids}: list the ids in ascending order ({sorted(ids)}); vLLM returns the layers' "
            "hidden states in layer order."
        )
    return ids


def resolve_layer_ids(model: ModelConfig, info: ModelInfo | None = None) -> list[int]:
    info = info or model_info(model.path)
    n = info.num_hidden_layers
    ids = list(model.layer_ids) if model.layer_ids is not None else default_layer_ids(n)
    return check_layer_ids(ids, n, key="model.layer_ids")

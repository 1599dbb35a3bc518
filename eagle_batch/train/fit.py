"""Does what training is given fit together? The data against the target (model.path), a checkpoint against
the draft this run builds, train.draft_vocab_size against the target's vocabulary, train.precision against
the CPU it runs on. A mismatch is a ConfigError that names the folder, the values and what to do, raised
before the first step (without these checks the first step fails on a tensor shape, or a checkpoint fails to
load, with a traceback); a setting that only costs time or changes what is trained is a warning."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from eagle_batch.config.load import ConfigError

# DraftConfig fields that shape the draft's weights, with the setting each comes from.
SHAPE_FIELDS = {
    "hidden_size": "the target's hidden size (model.path)",
    "vocab_size": "the target's vocabulary (model.path)",
    "draft_vocab_size": "train.draft_vocab_size",
    "intermediate_size": "train.draft_intermediate_size",
    "num_attention_heads": "train.draft_num_heads",
    "num_key_value_heads": "train.draft_num_kv_heads",
    "head_dim": "the target's head_dim (model.path)",
    "aux_layer_ids": "train.aux_layer_ids, or the layers of the data",
}


def check_data_fits_target(cfg: Any, dataset: Any, where: str) -> None:
    """The stored states must come from a model of model.path's shape: the draft is built from model.path and
    its loss runs the states through that model's final norm and lm_head."""
    from eagle_batch.config import model_info
    from eagle_batch.store.reader import StoreDataset

    if not isinstance(dataset, StoreDataset):  # in-memory data (tests, benchmarks) records no model
        return
    spec = dataset.spec
    info = model_info(cfg.model.path)
    differ = []
    if spec.hidden_size != info.hidden_size:
        differ.append(f"hidden_size {spec.hidden_size} in the data, {info.hidden_size} in model.path")
    if spec.num_hidden_layers and spec.num_hidden_layers != info.num_hidden_layers:
        differ.append(f"num_hidden_layers {spec.num_hidden_layers} in the data, {info.num_hidden_layers} in model.path")
    if differ:
        raise ConfigError(
            f"{where} holds hidden states of another model ({spec.model_name or '?'}: {'; '.join(differ)}) than "
            f"model.path={cfg.model.path}. Train with the model.path the data was extracted with, or point "
            "train.data (or run_dir) at a run extracted from this model."
        )


def check_checkpoint_fits(ckpt: dict, ckpt_path: Path, dcfg: Any) -> None:
    """A checkpoint resumes only into a draft of the same shape (same target, same train.draft_* settings)."""
    saved = ckpt.get("draft_config") or {}
    ours = dcfg.to_json()
    differ = [
        f"{key}={saved[key]} in the checkpoint, {ours[key]} now ({why})"
        for key, why in SHAPE_FIELDS.items()
        if key in saved and saved[key] != ours[key]
    ]
    if differ:
        out = ckpt_path.parent.parent
        raise ConfigError(
            f"{ckpt_path}: this draft was trained with another shape than this run builds: {'; '.join(differ)}. "
            f"Resume with the settings it was trained with ({out}/draft_config.json), or start a new draft "
            f"(another train.name, or delete {out})."
        )


def note_full_vocab(cfg: Any, vocab_size: int) -> None:
    """train.draft_vocab_size above the target's vocabulary means the whole vocabulary: say so once."""
    asked = int(cfg.train.draft_vocab_size)
    if asked > vocab_size:
        print(
            f"eagle-batch train: warning: train.draft_vocab_size={asked} is more than the target's vocabulary "
            f"({vocab_size} tokens, model.path={cfg.model.path}); the draft predicts the whole vocabulary "
            f"(draft_vocab_size {vocab_size}). Set train.draft_vocab_size={vocab_size} or less to silence this.",
            file=sys.stderr,
        )


# /proc/cpuinfo flags of CPUs that compute bfloat16 matmuls natively (x86 AVX512-BF16 and AMX, Arm's BF16).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_has_native_bf16(cpuinfo: str) -> bool | None:
    """From /proc/cpuinfo's text: whether the CPU computes bfloat16 natively; None when it lists no flags."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & set(NATIVE_BF16_FLAGS)) if flags else None


def note_emulated_bf16(cfg: Any, device_type: str, cpuinfo_path: str = "/proc/cpuinfo") -> None:
    """train.precision=bf16 (the default, for GPUs) on a CPU without native bfloat16: PyTorch emulates its
    matmuls, and a step takes 10-20x as long as in fp32 (a 2-core AVX2 VM: 3 steps of 2,048 tokens on the
    SmolLM2 draft in 181 s against 17 s). Say so once, with the setting that avoids it."""
    if device_type != "cpu" or cfg.train.precision != "bf16":
        return
    try:
        native = cpu_has_native_bf16(Path(cpuinfo_path).read_text())
    except OSError:
        return
    if native is False:
        print(
            "eagle-batch train: warning: train.precision=bf16 on a CPU without native bfloat16 (no avx512_bf16, "
            "amx_bf16 or bf16 in /proc/cpuinfo): its matmuls are emulated, 10-20x slower than fp32. "
            "Set train.precision=fp32 to train on this CPU.",
            file=sys.stderr,
        )

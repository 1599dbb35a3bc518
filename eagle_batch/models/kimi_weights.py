"""Random weights of a Kimi-K2.5 checkpoint, generated tensor by tensor and written as safetensors shards.

A Kimi-K2.5 text model at its real width (hidden 7168, vocabulary 163,840) holds ~10 B parameters even with
a few layers and experts: its embedding and lm_head alone are 2 x 163,840 x 7168 bf16 = 4.7 GB. Building it
as a transformers model on the CPU (float init of every parameter, then save_pretrained, then a reload to
rename the experts) takes minutes and twice its size in host memory. Here each tensor is drawn directly in
its dtype on `device` (the GPU when there is one), copied to the host and appended to a shard of at most
`shard_bytes`; the index file names each tensor's shard, as the real checkpoint's does.

Values, as transformers' initialisation followed by the builder's `normal_(0, std)` on every matrix gave:
matrices ~ N(0, std); norm scales 1, except the final norm (below); router correction biases 0 (or the
fixed-route ramp); vision biases 0. Two deliberate differences:
- the final norm's scale is drawn from U[0.5, 1.5): with all ones, RMSNorm only rescales each token and a
  store that held the normed last state instead of the pre-norm one (`capture/layers.py`, id N) would
  still show cosine 1 against the reference; with a non-trivial scale the two differ.
- rows of lm_head past the tokenizer's last token are zero when the vocabulary is larger than the
  tokenizer (the real vocabulary size with SmolLM2's 49k tokens): the random target then never emits an id
  its tokenizer cannot decode, since the largest of ~49k random logits is far above 0.
The same seed on the same device type gives the same weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .next_token_rule import NextTokenRule

# At most this many bytes per safetensors file (the real checkpoint's shards are ~4-10 GB).
SHARD_BYTES = 4 << 30


def text_weight_shapes(tc: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Names (transformers' DeepSeek-V3 names with per-expert weights, as the real checkpoint stores them,
    without the wrapper's `language_model.` prefix) and shapes of the text model, in layer order."""
    h, heads, vocab = tc["hidden_size"], tc["num_attention_heads"], tc["vocab_size"]
    nope, rope, v_dim = tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["v_head_dim"]
    q_lora, kv_lora = tc.get("q_lora_rank"), tc["kv_lora_rank"]
    inter, mi, experts = tc["intermediate_size"], tc["moe_intermediate_size"], tc["n_routed_experts"]
    shared = mi * int(tc.get("n_shared_experts") or 0)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(tc["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        a = p + "self_attn."
        if q_lora:
            shapes[a + "q_a_proj.weight"] = (q_lora, h)
            shapes[a + "q_a_layernorm.weight"] = (q_lora,)
            shapes[a + "q_b_proj.weight"] = (heads * (nope + rope), q_lora)
        else:
            shapes[a + "q_proj.weight"] = (heads * (nope + rope), h)
        shapes[a + "kv_a_proj_with_mqa.weight"] = (kv_lora + rope, h)
        shapes[a + "kv_a_layernorm.weight"] = (kv_lora,)
        shapes[a + "kv_b_proj.weight"] = (heads * (nope + v_dim), kv_lora)
        shapes[a + "o_proj.weight"] = (h, heads * v_dim)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        m = p + "mlp."
        if i < tc["first_k_dense_replace"]:
            shapes.update({m + "gate_proj.weight": (inter, h), m + "up_proj.weight": (inter, h)})
            shapes[m + "down_proj.weight"] = (h, inter)
            continue
        shapes[m + "gate.weight"] = (experts, h)
        shapes[m + "gate.e_score_correction_bias"] = (experts,)
        for e in range(experts):
            x = f"{m}experts.{e}."
            shapes.update(
                {x + "gate_proj.weight": (mi, h), x + "up_proj.weight": (mi, h), x + "down_proj.weight": (h, mi)}
            )
        if shared:
            x = m + "shared_experts."
            shapes.update({x + "gate_proj.weight": (shared, h), x + "up_proj.weight": (shared, h)})
            shapes[x + "down_proj.weight"] = (h, shared)
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (vocab, h)
    return shapes


def text_tensors(
    tc: dict[str, Any],
    dtype: torch.dtype,
    std: float,
    seed: int,
    fixed_route: bool,
    tokenizer_len: int,
    device: str | torch.device = "cpu",
    rule: NextTokenRule | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, host tensor) of every text weight, drawn on `device` one at a time (see the module docstring).

    `fixed_route`: every router's correction bias is the ramp E..1, spaced wider than sigmoid's range, so
    every token picks experts 0..top_k-1 (`tiny.fix_expert_routing`: the validation variant).
    `rule`: the embedding and lm_head give the target a known greedy next token (next_token_rule.py); the
    decoder layers are drawn as without it."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape in text_weight_shapes(tc).items():
        if rule is not None and name == "model.embed_tokens.weight":
            yield name, rule.embedding(shape[0], shape[1], dtype, device, gen).cpu()
            continue
        if rule is not None and name == "lm_head.weight":
            yield name, rule.lm_head(shape[0], shape[1], dtype, device).cpu()
            continue
        if name.endswith("e_score_correction_bias"):  # float32, as the real checkpoint keeps it
            n = shape[0]
            t = torch.arange(n, 0, -1, dtype=torch.float32) if fixed_route else torch.zeros(n, dtype=torch.float32)
            yield name, t
            continue
        if name == "model.norm.weight":
            t = (0.5 + torch.rand(shape, generator=gen, device=device)).to(dtype)
        elif len(shape) == 1:
            t = torch.ones(shape, dtype=dtype, device=device)
        else:
            t = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, std, generator=gen)
            if name == "lm_head.weight" and tokenizer_len < shape[0]:
                t[tokenizer_len:] = 0
        yield name, t.cpu()


class ShardWriter:
    """Appends tensors to safetensors files of at most `shard_bytes` and writes the index at `close()`
    (one file `model.safetensors` when everything fits one shard)."""

    def __init__(self, folder: Path, shard_bytes: int = SHARD_BYTES):
        self.folder, self.shard_bytes = Path(folder), shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[list[str]] = []  # tensor names per written shard
        self.total_bytes = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        size = t.numel() * t.element_size()
        if self.pending and self.pending_bytes + size > self.shard_bytes:
            self._flush()
        self.pending[name] = t.contiguous()
        self.pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        from safetensors.torch import save_file

        save_file(self.pending, str(self.folder / f"shard-{len(self.files):05d}.tmp"), metadata={"format": "pt"})
        self.files.append(list(self.pending))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> list[str]:
        """Write what is left; name the shards as the hub does; return the file names."""
        if self.pending or not self.files:
            self._flush()
        n = len(self.files)
        names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        for i, name in enumerate(names):
            (self.folder / f"shard-{i:05d}.tmp").rename(self.folder / name)
        if n > 1:
            index = {
                "metadata": {"total_size": self.total_bytes},
                "weight_map": {t: names[i] for i, ts in enumerate(self.files) for t in ts},
            }
            (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
        return names


def write_weights(
    folder: Path,
    tensors: Iterator[tuple[str, torch.Tensor]],
    transform: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    shard_bytes: int = SHARD_BYTES,
) -> list[str]:
    """Write `tensors` into `folder` as shards; `transform` maps each {name: tensor} (e.g. INT4 packing)."""
    w = ShardWriter(folder, shard_bytes)
    for name, t in tensors:
        for k, v in (transform({name: t}) if transform else {name: t}).items():
            w.add(k, v)
    return w.close()


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"

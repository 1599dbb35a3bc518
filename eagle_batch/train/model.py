"""The EAGLE-3 draft model (training side) and its export to a folder vLLM serves.

Architecture mirrors vLLM's `model_executor/models/llama_eagle3.py` exactly, so the exported weights
reproduce the training-time forward inside vLLM:

    g      = fc(concat(aux_low, aux_mid, aux_high))             # 3*H_target -> H      (step 0 only)
    x      = concat(input_layernorm(embed(tok)), hidden_norm(g))  # 2H; residual = g
    a      = self_attn(x)                                          # q/k/v: 2H -> heads*hd, o: -> H
    h, r   = post_attention_layernorm(a + residual), a + residual
    m      = mlp(h)
    out    = norm(m + r)   -> lm_head -> draft-vocab logits
    pre    = m + r         -> fed back as `g` of the next draft step (vLLM returns it as the aux output)

Three options vLLM's eagle3 model reads from the draft's config.json (speculators turns all three on for its
EAGLE-3 drafts, and so do the trainer's defaults, `train.norm_*`), each off in a bare `DraftConfig`:
`norm_before_fc` (an RMSNorm over the concatenated aux states before fc, weight `input_norm.weight`: a
target's layers differ in scale by orders of magnitude),
`norm_before_residual` (the residual is hidden_norm(g), not g), `norm_output` (the state fed back is
norm(m + r), not m + r).

Embeddings are the target's (frozen, never exported: vLLM shares the target's `embed_tokens` when the
draft has none). `d2t[i] = target_id(i) - i` (vLLM adds `arange(draft_vocab) + d2t`), `t2d` is a bool
mask over the target vocabulary.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from eagle_batch.models.folder import honour_umask

from .target import TargetHead, load_target_tensors, target_head  # noqa: F401 - re-exported (bench, tests)


@dataclass
class DraftConfig:
    hidden_size: int
    target_hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    aux_layer_ids: list[int]  # target layer ids of the 3 aux states (EAGLE-3 semantics: after k layers)
    last_layer_id: int  # N: the target's last-layer state (pre-norm) used for the targets
    rope: dict[str, Any] = field(default_factory=dict)  # target's rope_parameters / rope_theta / rope_scaling
    hidden_act: str = "silu"
    target_architecture: str = "LlamaForCausalLM"
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    norm_output: bool = False

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "DraftConfig":
        return cls(**d)


def _text_config(raw: dict) -> dict:
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(raw.get(key), dict) and "num_hidden_layers" in raw[key]:
            return raw[key]
    return raw


def draft_config_from_target(
    target_path: str | os.PathLike,
    aux_layer_ids: list[int],
    last_layer_id: int,
    draft_vocab_size: int,
    intermediate_size: int = 0,
    num_heads: int = 0,
    num_kv_heads: int = 0,
) -> DraftConfig:
    """Shape the draft like one decoder layer of the target (overridable), reading only config.json."""
    raw = json.loads((Path(target_path) / "config.json").read_text())
    tc = _text_config(raw)
    h = int(tc["hidden_size"])
    heads = num_heads or int(tc["num_attention_heads"])
    kv = num_kv_heads or int(tc.get("num_key_value_heads", heads) or heads)
    head_dim = int(tc.get("head_dim") or h // int(tc["num_attention_heads"]))
    rope = {k: tc[k] for k in ("rope_parameters", "rope_theta", "rope_scaling") if tc.get(k) is not None}
    vocab = int(tc["vocab_size"])
    return DraftConfig(
        hidden_size=h,
        target_hidden_size=h,
        intermediate_size=intermediate_size or int(tc.get("intermediate_size") or 4 * h),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        vocab_size=vocab,
        draft_vocab_size=min(draft_vocab_size, vocab),
        rms_norm_eps=float(tc.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(tc.get("max_position_embeddings", 4096)),
        aux_layer_ids=list(aux_layer_ids),
        last_layer_id=int(last_layer_id),
        rope=rope,
        # The draft's MLP is vLLM's LlamaMLP (SiluAndMul, which rejects any other activation) whatever the
        # target's own activation: the training MLP is silu too (DraftMLP).
        hidden_act="silu",
        target_architecture=(raw.get("architectures") or ["LlamaForCausalLM"])[0],
    )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Same order of operations as vLLM / HF Llama: normalize in fp32, scale in the input dtype.
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def served_rope(cfg: DraftConfig) -> dict[str, Any]:
    """The draft's rope keys for vLLM, stating the attention factor the trainer used.

    A YaRN target (DeepSeek-V3, Kimi-K2.5: rope_scaling {type: yarn, mscale: 1, mscale_all_dim: 1}) trains
    the draft with transformers' attention factor mscale(mscale) / mscale(mscale_all_dim) = 1.0. vLLM's
    Llama-architecture draft layer computes its own: 0.26 multiplies yarn_get_mscale(factor) (1.42 at factor
    64) unless `apply_yarn_scaling` is false, then uses `attn_factor`; 0.32 takes `attention_factor` when
    given. Both keys are written, so every version serves the attention the draft was trained with."""
    rope = json.loads(json.dumps(cfg.rope))  # a deep copy
    for key in ("rope_parameters", "rope_scaling"):
        params = rope.get(key)
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) == "yarn":
            _, scale = _rope_inv_freq(cfg)
            params.update(apply_yarn_scaling=False, attn_factor=float(scale), attention_factor=float(scale))
    return rope


def _rope_inv_freq(cfg: DraftConfig) -> tuple[torch.Tensor, float]:
    """inv_freq and attention scaling for the target's rope type, via transformers' own rope init."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kw: dict[str, Any] = dict(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
    )
    kw.update(cfg.rope)
    lc = LlamaConfig(**kw)
    params = getattr(lc, "rope_parameters", None) or getattr(lc, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default"
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(lc, "rope_theta", 10000.0)) if isinstance(params, dict) else 10000.0
        inv = 1.0 / (theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
        return inv, 1.0
    inv, scale = ROPE_INIT_FUNCTIONS[rope_type](lc, "cpu")
    return inv.float(), float(scale)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def ttt_mask(t: int, steps_before: int, device) -> torch.Tensor:
    """[T, (steps_before+1)*T] bool: causal over step 0's keys, the diagonal of each later step's keys."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * steps_before, dim=1)


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, kv_heads, T, D] -> [B, heads, T, D]; query head h uses kv head h // (heads // kv_heads), as in
    SDPA's enable_gqa. Expanded explicitly so that every SDPA backend (flash, cuDNN, memory-efficient)
    qualifies whatever its GQA support in the installed torch."""
    rep = heads // x.shape[1]
    if rep == 1:
        return x
    b, kv, t, d = x.shape
    return x[:, :, None].expand(b, kv, rep, t, d).reshape(b, kv * rep, t, d)


def _split_hi_lo(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x (fp32) as hi + lo in `dtype`: |x - (hi + lo)| ~ |x| * 2^-16 in bf16 (one bf16 number alone is off
    by ~|x| * 2^-9, too coarse for a log-weight). The gradient reaches x unchanged through hi + lo."""
    hi = x.to(dtype)
    return hi, (x - hi.float()).to(dtype)


# The SDPA kernels the draft's attention may use: not cuDNN's, which spends ~11 ms of host time per call
# planning for the call's shape, and a batch's padded length changes from step to step (on the H200 that was
# ~160 ms of a 0.42 s step, with the GPU busy 30% of it: docs/explanation/training.md, "A training step on a GPU"). The flash and
# memory-efficient kernels need no plan; math is the CPU's.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    with sdpa_kernel(SDPA_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def ttt_attention(
    q: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], impl: str = "merged"
) -> torch.Tensor:
    """Attention of TTT step s = len(cache) - 1. q: [B, heads, T, D]; cache[j] = (k_j, v_j) [B, kv_heads, T, D].

    Row i sees the step-0 keys of rows <= i and the step-j keys of row i for 1 <= j <= s. Two exact
    implementations:

    - "masked": one SDPA over the concatenated keys [step 0 | ... | step s] with a bool mask: O((s+1) T^2)
      scores, and an explicit mask rules out the flash kernels. The reference.
    - "merged" (default): causal SDPA over step 0 (flash-eligible, O(T^2 / 2)) merged with the s diagonal
      terms, computed per row in O(s T). With Z0 = sum_j exp(a_ij) over the causal scores and
      D = sum_k exp(d_ik) over the diagonal scores,
          out = (Z0 * o_causal + sum_k exp(d_ik) v_k,i) / (Z0 + D).
      SDPA does not return Z0, so the merge runs inside it: a sink key at position 0 that every query sees
      has score log D (carried by two extra query dims, hi + lo, against two 1s in the sink key) and value
      e (one extra value dim). Its output is then (Z0 * [o_causal, 0] + D * [0, 1]) / (Z0 + D): the first D
      dims are the causal part, the extra dim the weight of the diagonal part, whose normalized value
      average is added in plain tensor ops. Everything is differentiable (SDPA's own backward).
    """
    b, h, t, d = q.shape
    k0, v0 = _expand_kv(cache[0][0], h), _expand_kv(cache[0][1], h)
    s = len(cache) - 1
    if s == 0:
        return _sdpa(q, k0, v0, is_causal=True)
    scale = d**-0.5
    if impl == "masked":
        keys = torch.cat([k0] + [_expand_kv(k, h) for k, _ in cache[1:]], dim=2)
        values = torch.cat([v0] + [_expand_kv(v, h) for _, v in cache[1:]], dim=2)
        return _sdpa(q, keys, values, attn_mask=ttt_mask(t, s, q.device))
    if impl != "merged":
        raise ValueError(f"train.ttt_attention={impl!r}: expected 'merged' or 'masked'")
    kd = torch.stack([_expand_kv(k, h) for k, _ in cache[1:]], dim=-2)  # [B, h, T, s, D]
    vd = torch.stack([_expand_kv(v, h) for _, v in cache[1:]], dim=-2)
    diag = (q.float()[..., None, :] * kd.float()).sum(-1) * scale  # [B, h, T, s]
    log_d = torch.logsumexp(diag, dim=-1)  # [B, h, T]
    v_diag = (torch.softmax(diag, dim=-1)[..., None] * vd.float()).sum(-2)  # [B, h, T, D]
    # The sink's score is scale * (hi + lo) * 1 = log D: the query carries log D / scale.
    hi, lo = _split_hi_lo(log_d / scale, q.dtype)
    pad = 8  # head dims that are multiples of 8 keep every fused SDPA kernel eligible
    zeros = q.new_zeros(b, h, t, pad - 2)
    q_aug = torch.cat([q, hi[..., None], lo[..., None], zeros], dim=-1)
    k_aug = F.pad(k0, (0, pad))
    v_aug = F.pad(v0, (0, pad))
    sink_k = q.new_zeros(b, h, 1, d + pad)
    sink_k[..., d : d + 2] = 1.0
    sink_v = q.new_zeros(b, h, 1, d + pad)
    sink_v[..., d] = 1.0
    # A dummy query row 0 makes the causal square: query row i+1 sees the sink and keys 0..i.
    q_aug = torch.cat([q.new_zeros(b, h, 1, d + pad), q_aug], dim=2)
    k_aug = torch.cat([sink_k, k_aug], dim=2)
    v_aug = torch.cat([sink_v, v_aug], dim=2)
    o = _sdpa(q_aug, k_aug, v_aug, is_causal=True, scale=scale)[:, :, 1:]
    return (o[..., :d].float() + o[..., d : d + 1].float() * v_diag).to(q.dtype)


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig, impl: str = "merged"):
        super().__init__()
        self.cfg = cfg
        self.impl = impl
        h, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(2 * h, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, h, bias=False)
        inv, scale = _rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.rope_scale = scale

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [B, heads, T, hd]; positions: [B, T]
        freqs = positions[:, None, :, None].float() * self.inv_freq[None, None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = (emb.cos() * self.rope_scale).to(x.dtype), (emb.sin() * self.rope_scale).to(x.dtype)
        return x * cos + _rotate_half(x) * sin

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """One TTT step. `cache` holds (k, v) of the earlier steps of this unroll and is appended to.

        Row i of step s is the draft token at position i+s of the chain rooted at context row i. At
        inference that token sees the context's step-0 keys at positions <= i and its own chain's
        keys of steps 1..s, which are the keys at the same row i of those steps: a causal block over
        step 0 plus a diagonal per later step (as in SpecForge / the EAGLE-3 paper's TTT).
        """
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = self._rope(q, positions), self._rope(k, positions)
        cache.append((k, v))
        out = ttt_attention(q, cache, self.impl)
        out = out.transpose(1, 2).reshape(b, t, c.num_attention_heads * c.head_dim)
        return self.o_proj(out)


class DraftMLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """Named like the checkpoint's `midlayer.*` (vLLM maps `midlayer.` -> `layers.0.`)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, embeds, hidden, positions, cache):
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        a = self.self_attn(x, positions, cache)
        residual = a + residual
        m = self.mlp(self.post_attention_layernorm(residual))
        return m + residual  # pre-norm output; the model applies `norm`


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig, embed_weight: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        self.input_norm = (
            RMSNorm(cfg.num_aux * cfg.target_hidden_size, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        )
        self.fc = nn.Linear(cfg.num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = DraftLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # Vocabulary maps: buffers so they travel with state_dict / checkpoints.
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        # The target's embedding: frozen, not a parameter, not checkpointed (re-read from the target).
        emb = embed_weight if embed_weight is not None else torch.zeros(cfg.vocab_size, cfg.hidden_size)
        self.register_buffer("embed_tokens", emb, persistent=False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, std)

    @torch.no_grad()
    def init_head_from_target(self, lm_head_w: torch.Tensor, norm_w: torch.Tensor) -> None:
        """lm_head = the target's lm_head rows of the draft vocabulary, norm = the target's final norm (call
        after set_vocab_map): the draft then starts out reading its state the way the target reads its own
        last layer, as speculators initializes its drafts (which also keep lm_head frozen)."""
        ids = self.draft_to_target.to(lm_head_w.device)
        self.lm_head.weight.copy_(lm_head_w[ids].to(self.lm_head.weight))
        self.norm.weight.copy_(norm_w.to(self.norm.weight))

    def set_vocab_map(self, draft_to_target: torch.Tensor) -> None:
        """draft_to_target: sorted target ids of the draft vocabulary, length draft_vocab_size."""
        ids = draft_to_target.to(torch.long)
        assert ids.numel() == self.cfg.draft_vocab_size
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def draft_to_target(self) -> torch.Tensor:
        return self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_tokens)

    def step(
        self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: list, rows=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: (draft-vocab logits, the hidden to feed back: pre-norm, or with norm_output the
        normed). rows: logits only for these rows of the flattened [B*T] batch ([len(rows), Vd]); None: all
        ([B, T, Vd])."""
        emb = self.embed(ids).to(hidden.dtype)
        pre = self.midlayer(emb, hidden, positions, cache)
        if self.cfg.norm_output:
            post = self.norm(pre)
            out = post if rows is None else post.flatten(0, 1).index_select(0, rows)
            return self.lm_head(out), post
        out = pre if rows is None else pre.flatten(0, 1).index_select(0, rows)
        return self.lm_head(self.norm(out)), pre

    def forward(
        self,
        aux: torch.Tensor,
        ids_per_step: list[torch.Tensor],
        positions: torch.Tensor,
        rows: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """TTT unroll. aux: [B, T, 3*Ht]; ids_per_step[s]: [B, T] tokens fed at step s. Returns logits per
        step: [B, T, Vd], or with rows[s] (indexes into the flattened B*T rows) [len(rows[s]), Vd] - the
        rows the loss counts, so lm_head and the loss skip the rest."""
        hidden = self.fc(aux if self.input_norm is None else self.input_norm(aux))
        cache: list = []
        out = []
        for s, ids in enumerate(ids_per_step):
            logits, hidden = self.step(ids, hidden, positions + s, cache, None if rows is None else rows[s])
            out.append(logits)
        return out


# ----------------------------------------------------------------------------------------------------
# Export


def export_draft(model: Eagle3Draft, out_dir: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write config.json + model.safetensors in the layout vLLM's eagle3 loader (0.26 .. 0.32) expects."""
    from safetensors.torch import save_file

    cfg = model.cfg
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, p in model.state_dict().items():
        if name in ("d2t", "t2d"):
            continue
        tensors[name] = p.detach().to(dtype).contiguous().cpu()
    tensors["d2t"] = model.d2t.detach().to(torch.int64).contiguous().cpu()
    tensors["t2d"] = model.t2d.detach().to(torch.bool).contiguous().cpu()
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    honour_umask(tmp)  # safetensors writes 0600; others on a shared cluster must be able to serve the draft
    config = {
        # vLLM maps LlamaForCausalLMEagle3 -> llama_eagle3.Eagle3LlamaForCausalLM (0.26 and 0.32).
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "target_hidden_size": cfg.target_hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": str(dtype).replace("torch.", ""),
        # Read both at the top level (0.32 gpu_model_runner / eagle3_utils) and in eagle_config (0.26).
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
            "use_aux_hidden_state": True,
            "norm_before_fc": cfg.norm_before_fc,
        },
        "norm_before_fc": cfg.norm_before_fc,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_output": cfg.norm_output,
        "eagle_batch": {"draft_config": cfg.to_json()},
    }
    config.update(served_rope(cfg))
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir

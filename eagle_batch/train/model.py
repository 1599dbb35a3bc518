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

from eagle_batch.models.folder import honour_umask


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


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
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
        # One fused attention over the concatenated keys [step 0 | step 1 | ... | step s] with a mask
        # (causal block, then a diagonal per later step): SDPA's memory-efficient / flash kernels keep
        # memory O(T) instead of materializing [B, heads, T, T] scores for every unrolled step.
        s = len(cache) - 1
        keys = torch.cat([kv[0] for kv in cache], dim=2) if s else k
        values = torch.cat([kv[1] for kv in cache], dim=2) if s else v
        gqa = c.num_attention_heads != c.num_key_value_heads
        if s == 0:
            out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=ttt_mask(t, s, x.device), enable_gqa=gqa)
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
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, embeds, hidden, positions, cache):
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        a = self.self_attn(x, positions, cache)
        residual = a + residual
        m = self.mlp(self.post_attention_layernorm(residual))
        return m + residual  # pre-norm output; the model applies `norm`


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig, embed_weight: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
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
        self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: list
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: returns (draft-vocab logits, pre-norm hidden to feed back)."""
        emb = self.embed(ids).to(hidden.dtype)
        pre = self.midlayer(emb, hidden, positions, cache)
        return self.lm_head(self.norm(pre)), pre

    def forward(
        self, aux: torch.Tensor, ids_per_step: list[torch.Tensor], positions: torch.Tensor
    ) -> list[torch.Tensor]:
        """TTT unroll. aux: [B, T, 3*Ht]; ids_per_step[s]: [B, T] tokens fed at step s. Returns logits per step."""
        hidden = self.fc(aux)
        cache: list = []
        out = []
        for s, ids in enumerate(ids_per_step):
            logits, hidden = self.step(ids, hidden, positions + s, cache)
            out.append(logits)
        return out


# ----------------------------------------------------------------------------------------------------
# Target pieces (frozen): embedding, final norm, lm_head, read from the target's safetensors.


def load_target_tensors(target_path: str | os.PathLike, names: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    """Load only the named tensors (first alias found wins) from a target's safetensors files."""
    from safetensors import safe_open

    target_path = Path(target_path)
    files = sorted(target_path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{target_path}: no *.safetensors files (the draft needs the target's embedding, final norm and lm_head)"
        )
    index: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                index[k] = f
    out: dict[str, torch.Tensor] = {}
    for key, aliases in names.items():
        for a in aliases:
            if a in index:
                with safe_open(str(index[a]), "pt") as sf:
                    out[key] = sf.get_tensor(a)
                break
    return out


def target_head(target_path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """embed [V, H], norm [H], lm_head [V, H] (the embedding when the target ties them)."""
    t = load_target_tensors(
        target_path,
        {
            "embed": [
                "model.embed_tokens.weight",
                "model.language_model.embed_tokens.weight",
                "language_model.model.embed_tokens.weight",
                "embed_tokens.weight",
            ],
            "norm": [
                "model.norm.weight",
                "model.language_model.norm.weight",
                "language_model.model.norm.weight",
                "norm.weight",
            ],
            "lm_head": ["lm_head.weight", "language_model.lm_head.weight"],
        },
    )
    if "embed" not in t or "norm" not in t:
        raise KeyError(
            f"{target_path}: could not find the embedding / final norm weights "
            f"(found {sorted(t)}); is this a Llama-like checkpoint?"
        )
    if "lm_head" not in t:  # tie_word_embeddings
        t["lm_head"] = t["embed"]
    return t


class TargetHead(nn.Module):
    """The target's final norm + lm_head restricted to what the loss needs (frozen).

    `full_argmax=False` skips the full-vocabulary logits (the expensive part on a CPU: V x H per token)
    and reports the argmax over the draft vocabulary instead; accuracy is then an upper bound (a token
    outside the draft vocabulary can never be drafted).
    """

    def __init__(
        self,
        norm_w: torch.Tensor,
        lm_head_w: torch.Tensor,
        eps: float,
        draft_to_target: torch.Tensor,
        full_argmax: bool = True,
    ):
        super().__init__()
        self.register_buffer("norm_w", norm_w.float(), persistent=False)
        self.full_argmax = full_argmax
        ids = draft_to_target.long().to(lm_head_w.device)
        self.register_buffer("lm_head_w", lm_head_w if full_argmax else lm_head_w[ids].clone(), persistent=False)
        self.register_buffer("d2t_ids", draft_to_target.long(), persistent=False)
        self.eps = eps

    @torch.no_grad()
    def forward(self, last: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
        """last: [N, H] pre-norm last-layer states -> (log-probs over the draft vocab [N, Vd], argmax [N])."""
        logps, argmax = [], []
        w = self.lm_head_w
        for i in range(0, last.shape[0], chunk):
            x = last[i : i + chunk].float()
            x = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)) * self.norm_w
            logits = x.to(w.dtype) @ w.T  # [n, V] (full) or [n, Vd]
            if self.full_argmax:
                argmax.append(logits.argmax(-1))
                logits = logits[:, self.d2t_ids]
            else:
                argmax.append(self.d2t_ids[logits.argmax(-1)])
            logps.append(torch.log_softmax(logits.float(), dim=-1))
        return torch.cat(logps), torch.cat(argmax)


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
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids), "use_aux_hidden_state": True},
        "eagle_batch": {"draft_config": cfg.to_json()},
    }
    config.update(cfg.rope)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir

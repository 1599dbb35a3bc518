"""The target's frozen pieces the draft trains against: embedding, final norm and lm_head, read from the
target's safetensors, and `TargetHead`, which turns the stored last-layer states (id N, before the final
norm) into the target's next-token distribution over the draft vocabulary."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn as nn


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


# Where Llama-like checkpoints keep the final norm's weight (first found wins).
FINAL_NORM_NAMES = [
    "model.norm.weight",
    "model.language_model.norm.weight",
    "language_model.model.norm.weight",
    "norm.weight",
]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The target's final RMSNorm in float32: x / sqrt(mean(x^2) + eps) * weight (Llama-like, no +1 offset)."""
    x = x.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)) * weight.float()


def final_norm_weight(target_path: str | os.PathLike) -> torch.Tensor:
    """The final norm's weight [H] from the target's safetensors."""
    t = load_target_tensors(target_path, {"norm": FINAL_NORM_NAMES})
    if "norm" not in t:
        raise KeyError(
            f"{target_path}: no final norm weight (looked for {', '.join(FINAL_NORM_NAMES)}); "
            "is this a Llama-like checkpoint?"
        )
    return t["norm"]


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
            "norm": FINAL_NORM_NAMES,
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
    outside the draft vocabulary can never be drafted). `dtype`: the matmul's dtype (bf16 on a GPU, as the
    target's own lm_head runs in vLLM; fp32 on a CPU, where bf16 matmuls are several times slower).
    """

    def __init__(
        self,
        norm_w: torch.Tensor,
        lm_head_w: torch.Tensor,
        eps: float,
        draft_to_target: torch.Tensor,
        full_argmax: bool = True,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.register_buffer("norm_w", norm_w.float(), persistent=False)
        self.full_argmax = full_argmax
        ids = draft_to_target.long().to(lm_head_w.device)
        w = lm_head_w if full_argmax else lm_head_w[ids]
        self.register_buffer("lm_head_w", w.to(dtype or w.dtype).clone(), persistent=False)
        self.register_buffer("d2t_ids", draft_to_target.long(), persistent=False)
        self.eps = eps

    def _draft_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [n, H] pre-norm states -> (logits over the draft vocab [n, Vd], target argmax [n])."""
        w = self.lm_head_w
        x = rms_norm(x, self.norm_w, self.eps)
        logits = x.to(w.dtype) @ w.T  # [n, V] (full) or [n, Vd]
        if self.full_argmax:
            return logits[:, self.d2t_ids], logits.argmax(-1)
        return logits, self.d2t_ids[logits.argmax(-1)]

    @torch.no_grad()
    def forward(self, last: torch.Tensor, chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
        """last: [N, H] pre-norm last-layer states -> (log-probs over the draft vocab [N, Vd], argmax [N])."""
        logps, argmax = [], []
        for i in range(0, last.shape[0], chunk):
            logits, am = self._draft_logits(last[i : i + chunk])
            logps.append(torch.log_softmax(logits.float(), dim=-1))
            argmax.append(am)
        return torch.cat(logps), torch.cat(argmax)

    @torch.no_grad()
    def probs(self, last: torch.Tensor, chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
        """last: [N, H] -> (probabilities over the draft vocab [N, Vd] fp32, target argmax [N]), written chunk
        by chunk into one preallocated output (the full-vocabulary logits exist for one chunk at a time)."""
        n = last.shape[0]
        out = torch.empty(n, self.d2t_ids.numel(), dtype=torch.float32, device=last.device)
        arg = torch.empty(n, dtype=torch.long, device=last.device)
        for i in range(0, n, chunk):
            logits, am = self._draft_logits(last[i : i + chunk])
            torch.softmax(logits.float(), dim=-1, out=out[i : i + chunk])
            arg[i : i + chunk] = am
        return out, arg

"""Muon with its Newton-Schulz orthogonalization in float32, for training on the CPU.

torch's `torch.optim.Muon` orthogonalizes every update in bfloat16. A CPU without native bfloat16 matmuls
(AVX512-BF16 or AMX) emulates them: on an AVX2 EPYC a 576 x 576 @ 576 x 1728 product took 0.79 s in
bfloat16 against 0.015 s in float32, so a SmolLM2 draft's 40 training steps took over 15 minutes. On a GPU
bfloat16 is the fast path and `DraftOptimizer` keeps torch's class there.

`Float32Muon` is torch's Muon in every other respect (Nesterov momentum, the learning rate adjusted to the
matrix's shape, decoupled weight decay): the same constructor, param groups and state (`momentum_buffer`),
so a checkpoint moves between the two.
"""

from __future__ import annotations

import math

import torch


def orthogonalize(grad: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of torch's Muon, in float32: about U V^T for grad = U S V^T."""
    a, b, c = coefficients
    x = grad.float()
    wide = grad.size(0) > grad.size(1)
    if wide:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if wide else x


def adjusted_lr(lr: float, rule: str | None, shape: torch.Size) -> float:
    """torch's Muon learning-rate adjustment: "match_rms_adamw" gives the update AdamW's RMS."""
    rows, cols = shape[:2]
    if rule is None or rule == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if rule == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


class Float32Muon(torch.optim.Muon):
    """torch's Muon whose orthogonalization runs in float32 (see the module docstring)."""

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss

"""The TTT loss: soft cross-entropy against the target's distribution over the draft vocabulary.

Alignment (vLLM's eagle proposer): draft row i at TTT step s is fed token x[i+s+1] at position i+s and
predicts x[i+s+2]; its target is the target's distribution at position i+s+1 (from the stored last-layer
state there); the loss counts where loss_mask[i+s+2] == 1. Step 0 gets fc(aux[i]); step s>0 gets step
s-1's pre-norm output of the same row. Per step, the loss is the mean over the counted rows; steps are
weighted `decay ** s`. Top-1 accuracy per step compares the draft's argmax (mapped to target ids) with the
target's argmax.

Nothing here reads a value back to the host (no `.item()`, no boolean-mask indexing, no `.any()`): every
row is computed and the loss mask weights it, so a GPU step runs without a stall; statistics stay on the
device until a log step reads them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .target import TargetHead


def _ce_forward(logits: torch.Tensor, p: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    per_row = lse - (p * lf).sum(-1)
    return torch.where(m != 0, per_row * m, 0.0).sum(), lse


def _ce_backward(logits: torch.Tensor, p: torch.Tensor, m: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor):
    q = torch.exp(logits.float() - lse[..., None])
    return ((q - p) * (m * grad)[..., None]).to(logits.dtype)


class CrossEntropyKernels:
    """The soft cross-entropy's forward and backward, eager or compiled.

    These two are memory-bound passes over [rows, draft_vocab] per TTT step (at 16k tokens x 32k draft
    tokens, 0.5G elements): eager PyTorch runs each as 5-6 separate kernels with fp32 temporaries, which on
    a GPU costs more than the lm_head matmul itself. `compiled=True` has torch.compile (inductor) fuse each
    into one or two kernels; if compiling or running a compiled kernel fails, a warning is printed and the
    eager functions are used from then on (a training run is not lost to a compiler problem)."""

    def __init__(self, compiled: bool = False):
        self.forward, self.backward = _ce_forward, _ce_backward
        self._compiled: dict[str, Any] = {}
        if compiled:
            self._compiled = {
                "forward": torch.compile(_ce_forward, dynamic=True),
                "backward": torch.compile(_ce_backward, dynamic=True),
            }

    def run(self, which: str, *args):
        fn = self._compiled.get(which)
        if fn is not None:
            try:
                return fn(*args)
            except Exception as e:  # noqa: BLE001 - any compiler failure: fall back, keep training
                print(
                    f"[eagle-batch train] torch.compile of the loss failed ({type(e).__name__}: {e}); eager from now on"
                )
                self._compiled = {}
        return getattr(self, which)(*args)


EAGER_CE = CrossEntropyKernels(compiled=False)


class _SoftCrossEntropy(torch.autograd.Function):
    """sum_r m_r * CE(p_r, softmax(logits_r)), gradient (softmax(logits_r) - p_r) * m_r.

    Saves only the logits (their dtype: bf16 under autocast) and one logsumexp per row, where autograd's
    log_softmax / exp / mul / sum chain would keep two or three fp32 [rows, Vd] tensors per TTT step.
    Exact when every p_r with m_r != 0 sums to 1 (the renormalized target)."""

    @staticmethod
    def forward(ctx, logits, p, m, kernels):
        loss, lse = kernels.run("forward", logits, p, m)
        ctx.save_for_backward(logits, p, m, lse)
        ctx.kernels = kernels
        return loss

    @staticmethod
    def backward(ctx, grad):
        logits, p, m, lse = ctx.saved_tensors
        return ctx.kernels.run("backward", logits, p, m, lse, grad), None, None, None


def soft_cross_entropy(
    logits: torch.Tensor, p: torch.Tensor, m: torch.Tensor, kernels: CrossEntropyKernels = EAGER_CE
) -> torch.Tensor:
    """sum over rows of m * CE(p, softmax(logits)); rows on the last dim, any leading shape (strided views
    are fine: nothing is made contiguous). m: [...] float weights (the loss mask)."""
    return _SoftCrossEntropy.apply(logits, p, m, kernels)


def ttt_inputs(ids: torch.Tensor, ttt_steps: int) -> list[torch.Tensor]:
    """Tokens fed at each TTT step: step s, row i gets ids[i+s+1] (0 past the end); each [B, T] like ids."""
    t = ids.shape[1]
    return [F.pad(ids[:, s + 1 :], (0, min(s + 1, t))) for s in range(ttt_steps)]


def ttt_loss(
    model: Any,
    head: TargetHead,
    batch: dict,
    ttt_steps: int,
    decay: float,
    autocast: bool,
    kernels: CrossEntropyKernels = EAGER_CE,
) -> tuple[torch.Tensor, dict]:
    """Unrolled TTT loss on one padded batch. Returns (weighted loss, per-step statistics on the device:
    loss_sum, correct, count, each [ttt_steps])."""
    ids = batch["input_ids"]
    b, t = ids.shape
    device = ids.device
    mask = batch["loss_mask"].to(torch.float32)
    p, tgt_arg = head.probs(batch["last"])  # [b, t, Vd] fp32, [b, t]
    positions = torch.arange(t, device=device).expand(b, t)
    aux = batch["aux"] if autocast else batch["aux"].float()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(aux, ttt_inputs(ids, ttt_steps), positions)
    d2t_ids = model.draft_to_target
    total = torch.zeros((), device=device)
    zero = torch.zeros((), device=device)
    loss_sum, correct, count = [], [], []
    for s, lg in enumerate(logits):
        n = t - s - 2  # rows whose predicted token (i+s+2) lies inside the batch
        if n <= 0:
            for acc in (loss_sum, correct, count):
                acc.append(zero)
            continue
        m = mask[:, s + 2 :]
        lg_s = lg[:, :n]
        step_sum = soft_cross_entropy(lg_s, p[:, s + 1 : t - 1], m, kernels)
        step_count = m.sum()
        total = total + (decay**s) * step_sum / step_count.clamp_min(1.0)
        with torch.no_grad():
            hit = d2t_ids[lg_s.argmax(-1)] == tgt_arg[:, s + 1 : t - 1]
            correct.append((hit.float() * m).sum())
        loss_sum.append(step_sum.detach())
        count.append(step_count)
    if not total.requires_grad:  # no row in range: keep the graph so backward (and DDP's all-reduce) runs
        total = total + 0.0 * logits[0].float().sum()
    stats = {"loss_sum": torch.stack(loss_sum), "correct": torch.stack(correct), "count": torch.stack(count)}
    return total, stats

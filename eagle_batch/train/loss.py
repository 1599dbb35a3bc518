"""The TTT loss: soft cross-entropy against the target's distribution over the draft vocabulary.

Alignment (vLLM's eagle proposer): draft row i at TTT step s is fed token x[i+s+1] at position i+s and
predicts x[i+s+2]; its target is the target's distribution at position i+s+1 (from the stored last-layer
state there); the loss counts where loss_mask[i+s+2] == 1. Step 0 gets fc(aux[i]); step s>0 gets step
s-1's pre-norm output of the same row. Per step, the loss is the mean over the counted rows; steps are
weighted `decay ** s`. Top-1 accuracy per step compares the draft's argmax (mapped to target ids) with the
target's argmax.

Nothing here reads a value back to the host (no `.item()`, no boolean-mask indexing, no `.any()`): which
rows count is worked out on the CPU from the batch's loss mask before the batch goes to the device
(`ttt_plan`), so the lm_head, the loss and the target distributions run on the counted rows only (with
assistant-only masks, ~60% of the padded batch) at sizes the host already knows; statistics stay on the
device until a log step reads them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .target import TargetHead


def _ce_forward(logits: torch.Tensor, p_all: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    logq = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    return -(p_all.index_select(0, idx) * logq).sum()


def _ce_backward(logits: torch.Tensor, p_all: torch.Tensor, idx: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    q = torch.softmax(logits, dim=-1, dtype=torch.float32)
    q.sub_(p_all.index_select(0, idx)).mul_(grad)
    return q.to(logits.dtype)


class CrossEntropyKernels:
    """The soft cross-entropy's forward and backward, eager or compiled.

    Both are memory-bound passes over [rows, draft_vocab] per TTT step (16k rows x 32k draft tokens: 0.5G
    elements): eager PyTorch runs each as several kernels with fp32 temporaries (~35 bytes moved per element
    each way), which on a GPU costs more than the lm_head matmul itself. `compiled=True` has torch.compile
    (inductor) fuse each, gather of the target rows included, into one or two kernels (~10 bytes per
    element); if compiling or running a compiled kernel fails, a warning is printed and the eager
    functions are used from then on (a training run is not lost to a compiler problem)."""

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
    """sum_r CE(p_all[idx_r], softmax(logits_r)); gradient softmax(logits_r) - p_all[idx_r].

    Saves only the logits (their dtype: bf16 under autocast) and recomputes the softmax in backward, where
    autograd's log_softmax / mul / sum chain would keep fp32 [rows, Vd] tensors per TTT step. Exact when
    every target row sums to 1 (the renormalized target)."""

    @staticmethod
    def forward(ctx, logits, p_all, idx, kernels):
        ctx.save_for_backward(logits, p_all, idx)
        ctx.kernels = kernels
        return kernels.run("forward", logits, p_all, idx)

    @staticmethod
    def backward(ctx, grad):
        logits, p_all, idx = ctx.saved_tensors
        return ctx.kernels.run("backward", logits, p_all, idx, grad), None, None, None


def soft_cross_entropy(
    logits: torch.Tensor, p_all: torch.Tensor, idx: torch.Tensor, kernels: CrossEntropyKernels = EAGER_CE
) -> torch.Tensor:
    """sum over rows r of CE(p_all[idx[r]], softmax(logits[r])). logits [n, Vd]; p_all [m, Vd] target
    probabilities; idx [n] which target row each logit row is scored against."""
    return _SoftCrossEntropy.apply(logits, p_all, idx, kernels)


def ttt_inputs(ids: torch.Tensor, ttt_steps: int) -> list[torch.Tensor]:
    """Tokens fed at each TTT step: step s, row i gets ids[i+s+1] (0 past the end); each [B, T] like ids."""
    t = ids.shape[1]
    return [F.pad(ids[:, s + 1 :], (0, min(s + 1, t))) for s in range(ttt_steps)]


def ttt_plan(loss_mask: torch.Tensor, ttt_steps: int) -> dict:
    """Which rows the loss reads, from the batch's loss mask [B, T] on the CPU (computed there so the device
    never has to report a count). Indexes are into the flattened B*T rows:

    - need: the positions whose target distribution some step uses (p with loss_mask[p+1] == 1);
    - rows[s]: the rows i of step s whose predicted token i+s+2 counts (loss_mask[i+s+2] == 1);
    - tgt[s]: for each of those, its target's index in `need` (position i+s+1);
    - count[s]: len(rows[s]), a host int;
    - chain_count[s]: the rows whose predicted tokens i+2 .. i+s+2 all count, a host int: the rows a chain
      of s+1 draft tokens can be judged on (a served draft only ever continues through answer tokens).
    """
    lm = loss_mask.bool()
    b, t = lm.shape
    need = torch.zeros(b, t, dtype=torch.bool)
    need[:, :-1] = lm[:, 1:]
    need_pos = need.flatten().nonzero().squeeze(1)
    inv = torch.full((b * t,), -1, dtype=torch.long)
    inv[need_pos] = torch.arange(need_pos.numel())
    rows, tgt, count, chain_count = [], [], [], []
    chained = torch.ones(b, t, dtype=torch.bool)
    for s in range(ttt_steps):
        valid = torch.zeros(b, t, dtype=torch.bool)
        n = t - s - 2  # rows whose predicted token lies inside the batch
        if n > 0:
            valid[:, :n] = lm[:, s + 2 :]
        r = valid.flatten().nonzero().squeeze(1)
        rows.append(r)
        tgt.append(inv[r + s + 1])
        count.append(int(r.numel()))
        chained &= valid
        chain_count.append(int(chained.sum()))
    return {"need": need_pos, "rows": rows, "tgt": tgt, "count": count, "chain_count": chain_count}


def plan_to(plan: dict, device: torch.device) -> dict:
    """The plan's index tensors on `device`, copied asynchronously (pinned first when it is a GPU)."""

    def move(x: torch.Tensor) -> torch.Tensor:
        if device.type != "cuda":
            return x.to(device)
        return x.pin_memory().to(device, non_blocking=True)

    return {
        "need": move(plan["need"]),
        "rows": [move(x) for x in plan["rows"]],
        "tgt": [move(x) for x in plan["tgt"]],
        "count": list(plan["count"]),
        "chain_count": list(plan["chain_count"]),
    }


def ttt_loss(
    model: Any,
    head: TargetHead,
    batch: dict,
    ttt_steps: int,
    decay: float,
    autocast: bool,
    kernels: CrossEntropyKernels = EAGER_CE,
    plan: dict | None = None,
) -> tuple[torch.Tensor, dict]:
    """Unrolled TTT loss on one padded batch. Returns (weighted loss, per-step statistics: loss_sum, correct
    and chain on the device, count a CPU tensor; each [ttt_steps]).

    correct[s]: rows whose step s gives the target's top token (step s is fed the true tokens, so this
    counts rows whose earlier steps were wrong too), out of count[s]. chain[s]: rows whose steps 0..s all
    do, out of chain_count[s] (the rows whose tokens at steps 0..s all count): what a server accepts up to
    draft position s+1 (tests/train/train_serve_agreement.py measures the match).

    `plan` (ttt_plan, on the batch's device): the trainer builds it from the CPU batch; without it, it is
    built here from batch["loss_mask"] (which waits for the device when the mask lives there)."""
    ids = batch["input_ids"]
    b, t = ids.shape
    device = ids.device
    if plan is None:
        plan = plan_to(ttt_plan(batch["loss_mask"].cpu(), ttt_steps), device)
    last = batch["last"]
    p_need, arg_need = head.probs(last.reshape(-1, last.shape[-1]).index_select(0, plan["need"]))
    positions = torch.arange(t, device=device).expand(b, t)
    aux = batch["aux"] if autocast else batch["aux"].float()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(aux, ttt_inputs(ids, ttt_steps), positions, rows=plan["rows"])
    d2t_ids = model.draft_to_target
    total = torch.zeros((), device=device)
    loss_sum, correct, chain_hits = [], [], []
    chain = torch.ones(b * t, dtype=torch.bool, device=device)  # row i's steps so far all right
    for s, lg in enumerate(logits):
        step_sum = soft_cross_entropy(lg, p_need, plan["tgt"][s], kernels)
        total = total + (decay**s) * step_sum / max(1, plan["count"][s])
        with torch.no_grad():
            hit = d2t_ids[lg.argmax(-1)] == arg_need.index_select(0, plan["tgt"][s])
            correct.append(hit.sum().float())
            # Rows not counted at step s (their token is not a loss token) end their chain there.
            chain &= torch.zeros_like(chain).index_copy_(0, plan["rows"][s], hit)
            chain_hits.append(chain.index_select(0, plan["rows"][s]).sum().float())
        loss_sum.append(step_sum.detach())
    if not total.requires_grad:  # keep the graph so backward (and DDP's all-reduce) runs
        total = total + 0.0 * sum(lg.float().sum() for lg in logits)
    stats = {
        "loss_sum": torch.stack(loss_sum),
        "correct": torch.stack(correct),
        "chain": torch.stack(chain_hits),
        "count": torch.tensor(plan["count"], dtype=torch.float32),
        "chain_count": torch.tensor(plan["chain_count"], dtype=torch.float32),
    }
    return total, stats

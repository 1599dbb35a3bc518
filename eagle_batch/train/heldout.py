"""The draft on held-out samples (`train.holdout_fraction`): the TTT loss and the acceptance it implies.

Held-out samples are chosen by a hash of their sample id (train.follow.is_heldout), so a pipelined run and a
run trained after extraction hold out the same samples, and drafts of one sweep are compared on the same data.
The figures use the trainer's own loss and statistics (train/loss.py) without gradients:

- `loss`: the training objective, sum over TTT steps s of decay^s x (soft cross-entropy summed over the
  held-out loss tokens / their count);
- `acc_chain_per_step[s]`: the share of loss tokens whose draft steps 0..s all give the target's top token,
  and `acceptance_length` = 1 + their sum: the mean acceptance length a server would see at k = ttt_steps,
  teacher-forced (train/loss.py says how it matches serving).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from .data import BatchPlan, TrainSamples, collate, trained_lengths
from .follow import TrainSubset
from .loss import CrossEntropyKernels, plan_to, ttt_loss, ttt_plan


def evaluate_heldout(
    model: Any, head: Any, samples: TrainSamples, ids: np.ndarray, lengths: np.ndarray, tc, device: torch.device
) -> dict | None:
    """The held-out figures of the draft over dataset indices `ids` (None when there are none)."""
    if not len(ids):
        return None
    k = tc.ttt_steps
    lengths = trained_lengths(lengths, tc.max_length)
    batches = TrainSubset(BatchPlan(lengths, tc.batch_tokens, seed=0, world_size=1), ids).rank_batches(0, 0)
    loader = DataLoader(samples, batch_sampler=batches, collate_fn=collate, num_workers=0)
    loss_sum = torch.zeros(k)
    chain = torch.zeros(k)
    count = torch.zeros(k)
    chain_count = torch.zeros(k)
    tokens = 0
    autocast = tc.precision == "bf16"
    kernels = CrossEntropyKernels(compiled=False)
    model.eval()
    with torch.no_grad():
        for batch in loader:
            tokens += int(batch["lengths"].sum())
            plan = plan_to(ttt_plan(batch["loss_mask"], k), device)
            batch = {name: v.to(device) for name, v in batch.items()}
            _, st = ttt_loss(model, head, batch, k, tc.ttt_decay, autocast, kernels, plan)
            loss_sum += st["loss_sum"].float().cpu()
            chain += st["chain"].float().cpu()
            count += st["count"]
            chain_count += st["chain_count"]
    per_step = (loss_sum / count.clamp_min(1)).tolist()
    chain_rate = (chain / chain_count.clamp_min(1)).tolist()
    return {
        "samples": int(len(ids)),
        "tokens": tokens,
        "loss_tokens": int(count[0]),
        "loss": float(sum((tc.ttt_decay**s) * v for s, v in enumerate(per_step))),
        "loss_per_step": per_step,
        "acc_chain_per_step": chain_rate,
        "acceptance_length": 1.0 + float(sum(chain_rate)),
    }

"""The draft's optimizer and its learning-rate schedule, stepped as one (`train.optimizer`).

- `adamw`: one AdamW over every trainable parameter, betas (0.9, 0.95), fused on CUDA.
- `muon` (default): torch's Muon (on the CPU `muon.Float32Muon`) on the draft's 2-D weight matrices except lm_head (fc, the attention and MLP
  projections), AdamW on the rest (the norms, lm_head), as speculators trains its EAGLE-3 drafts by
  default. Muon's update RMS is matched to AdamW's (`adjust_lr_fn="match_rms_adamw"`), so one `train.lr`
  serves both groups; momentum 0.95 (Nesterov) and weight decay MUON_WEIGHT_DECAY, speculators' values.

Every optimizer gets a LambdaLR over the one shared `LRSchedule`, so the warm-up, the cosine and a total
refitted later (train.time_budget_s) move every group together. Checkpoints: with adamw the state dicts are
AdamW's and LambdaLR's own (the layout of checkpoints before this option); with muon, lists of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from eagle_batch.config.load import ConfigError

from .muon import Float32Muon
from .schedule import LRSchedule

OPTIMIZERS = ("adamw", "muon")
ADAMW_BETAS = (0.9, 0.95)
MUON_MOMENTUM = 0.95
MUON_WEIGHT_DECAY = 0.1


def muon_split(named: Iterable[tuple[str, torch.nn.Parameter]]) -> tuple[list, list]:
    """(Muon's parameters, AdamW's): trainable 2-D weights except lm_head, and everything else trainable."""
    matrices, rest = [], []
    for name, p in named:
        if p.requires_grad:
            (matrices if p.ndim == 2 and not name.startswith("lm_head") else rest).append(p)
    return matrices, rest


class DraftOptimizer:
    """The optimizers of one training run and their schedules: `zero_grad()`, `step()` (every optimizer, then
    every schedule), `set_total(steps)`, `last_lr()`, `state_dict()` / `load_state_dict()`."""

    def __init__(self, model: torch.nn.Module, tc: Any, total_steps: int, device: torch.device):
        if tc.optimizer not in OPTIMIZERS:
            raise ValueError(f"train.optimizer={tc.optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
        self.kind = tc.optimizer
        self.schedule = LRSchedule(tc.warmup_steps, total_steps, tc.min_lr_ratio)
        # fused: one kernel for the whole update on CUDA (the default foreach path launches several per group)
        fused = device.type == "cuda"

        def adamw(params: list) -> torch.optim.AdamW:
            return torch.optim.AdamW(params, lr=tc.lr, betas=ADAMW_BETAS, weight_decay=tc.weight_decay, fused=fused)

        if self.kind == "adamw":
            self.optimizers: list[torch.optim.Optimizer] = [adamw([p for p in model.parameters() if p.requires_grad])]
        else:
            matrices, rest = muon_split(model.named_parameters())
            # On the CPU the orthogonalization runs in float32: bfloat16 matmuls are emulated there (.muon).
            muon_class = torch.optim.Muon if device.type == "cuda" else Float32Muon
            muon = muon_class(
                matrices,
                lr=tc.lr,
                weight_decay=MUON_WEIGHT_DECAY,
                momentum=MUON_MOMENTUM,
                adjust_lr_fn="match_rms_adamw",
            )
            self.optimizers = [muon, adamw(rest)]
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, self.schedule) for o in self.optimizers]

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=True)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()
        for s in self.schedulers:
            s.step()

    def set_total(self, total: int) -> None:
        """Move the end of the cosine to step `total` (every group: they share the schedule)."""
        self.schedule.total = total

    def last_lr(self) -> float:
        return self.schedulers[0].get_last_lr()[0]

    def state_dict(self) -> tuple[Any, Any]:
        """(optimizer state, scheduler state) for a checkpoint."""
        opts = [o.state_dict() for o in self.optimizers]
        scheds = [s.state_dict() for s in self.schedulers]
        return (opts[0], scheds[0]) if self.kind == "adamw" else (opts, scheds)

    def load_state_dict(self, opt_state: Any, sched_state: Any) -> None:
        lists = isinstance(opt_state, list)
        if lists != (self.kind == "muon"):
            saved = "muon" if lists else "adamw"
            raise ConfigError(
                f"the checkpoint was trained with train.optimizer={saved}, this run asks for {self.kind}: "
                f"resume with train.optimizer={saved}, or start a new run (another train.name)"
            )
        opts, scheds = (opt_state, sched_state) if lists else ([opt_state], [sched_state])
        for o, st in zip(self.optimizers, opts):
            o.load_state_dict(st)
        for s, st in zip(self.schedulers, scheds):
            s.load_state_dict(st)

"""What a training run reports: metrics.jsonl + TensorBoard (`Metrics`), and live progress on the console.

Live progress on rank 0 (issue 21: a long run must not look dead).

On a terminal (stderr is a TTY): a tqdm bar with steps, ETA and the latest loss, accuracy and tokens/s.
Otherwise (logs, Slurm, pipes): one plain line per logged step. `train.progress=false` (`eagle-batch train
--no-progress`) prints neither; metrics.jsonl has every number either way. Only host-side values are read
per step (step count, token count from the CPU batch); device values come from the log step's record,
which the trainer synchronizes anyway.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO


def _hms(s: float) -> str:
    s = int(max(0, s))
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


def _terminal_sized(stream) -> bool:
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return size.columns > 0 and size.lines > 0


class TrainProgress:
    def __init__(self, total_steps: int, start_step: int, enabled: bool = True, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.total, self.start = total_steps, start_step
        self.t0 = time.monotonic()
        self.bar: Any = None
        tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        if tty:
            try:
                from tqdm.auto import tqdm
            except ImportError:  # tqdm comes with transformers; without it, plain lines
                tqdm = None
            if tqdm is not None:
                # A terminal that reports no size (a bare pty, some batch consoles) makes tqdm draw nothing.
                sized = _terminal_sized(self.stream)
                self.bar = tqdm(
                    total=total_steps,
                    initial=start_step,
                    desc="train",
                    unit="step",
                    file=self.stream,
                    dynamic_ncols=sized,
                    ncols=None if sized else 160,
                    nrows=None if sized else 24,
                    smoothing=0.05,
                )

    def note(self, msg: str) -> None:
        """A one-off line (setup phases that take a while), above the bar on a terminal."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(f"train: {msg}", file=self.stream)
        else:
            self.stream.write(f"train: {msg}\n")
            self.stream.flush()

    def set_total(self, total: int) -> None:
        self.total = total
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def log(self, rec: dict) -> None:
        """At a log step, with the metrics record (step, loss, acc_per_step, tokens_per_s, ...)."""
        if not self.enabled:
            return
        acc = "/".join(f"{a:.2f}" for a in rec.get("acc_per_step", []))
        if "expected_acceptance_length" in rec:
            # Estimated on the training batches (the data's own answers, teacher-forced): above what serving
            # measures on new prompts (`eagle-batch evaluate`), by far for a draft fitted on little data.
            acc += f", train-time accept {rec['expected_acceptance_length']:.2f}"
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"loss {rec['loss']:.3f}, acc {acc}, {rec['tokens_per_s'] / 1e3:.1f}k train tok/s",
                refresh=False,
            )
            return
        step = rec["step"]
        done = step - self.start
        el = time.monotonic() - self.t0
        eta = el / done * (self.total - step) if done > 0 else float("nan")
        self.stream.write(
            f"train: step {step}/{self.total} ({step / max(1, self.total):.0%}) | epoch {rec.get('epoch', 0)} | "
            f"loss {rec['loss']:.4f} | acc {acc} | {rec['tokens_per_s']:,.0f} training tok/s | "
            f"elapsed {_hms(el)} | ETA {_hms(eta) if eta == eta else '?'}\n"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Metrics:
    """metrics.jsonl (one JSON line per logged step) and, optionally, TensorBoard scalars (rank 0)."""

    def __init__(self, out_dir: Path, enabled: bool, tensorboard: bool):
        self.enabled = enabled
        self.f = open(out_dir / "metrics.jsonl", "a") if enabled else None
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tb"))
            except Exception as e:  # tensorboard missing: JSONL still has everything
                print(f"[eagle-batch train] TensorBoard disabled: {e}")

    def log(self, rec: dict) -> None:
        if not self.enabled:
            return
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        if self.tb is not None:
            step = rec["step"]
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, step)
                elif isinstance(v, list):
                    for i, x in enumerate(v):
                        self.tb.add_scalar(f"{k}/{i}", x, step)

    def close(self) -> None:
        if self.f:
            self.f.close()
        if self.tb is not None:
            self.tb.close()


def setup_note(rank: int, enabled: bool):
    """Setup lines before the progress display exists (rank 0, unless progress is off)."""

    def note(msg: str) -> None:
        if enabled and rank == 0:
            print(f"train: {msg}", file=sys.stderr, flush=True)

    return note

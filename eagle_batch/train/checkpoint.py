"""Checkpoint files and the RNG state a resume restores: RUN/train/<name>/checkpoints/step-XXXXXXXX.pt
(atomic rename, the last two kept) and checkpoints/latest naming the newest."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch


def rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def latest_checkpoint(out_dir: Path) -> Path | None:
    p = out_dir / "checkpoints" / "latest"
    if not p.is_file():
        return None
    ck = out_dir / "checkpoints" / p.read_text().strip()
    return ck if ck.is_file() else None


def save_checkpoint(out_dir: Path, state: dict, keep: int = 2) -> Path:
    d = out_dir / "checkpoints"
    d.mkdir(parents=True, exist_ok=True)
    name = f"step-{state['step']:08d}.pt"
    tmp = d / (name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, d / name)
    (d / "latest.tmp").write_text(name + "\n")
    os.replace(d / "latest.tmp", d / "latest")
    for old in sorted(d.glob("step-*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
    return d / name

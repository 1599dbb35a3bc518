"""Checkpoint files and the RNG state a resume restores: RUN/train/<name>/checkpoints/step-XXXXXXXX.pt
(atomic rename, the last two kept) and checkpoints/latest naming the newest; the draft settings a resume
must keep."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from eagle_batch.config.load import ConfigError


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
    """The checkpoint a training resumes from: the one checkpoints/latest names, else the newest step-*.pt (a
    crash between the two renames of save_checkpoint); None when there is none. A `latest` naming a file that
    no longer exists, with no other checkpoint, is a ConfigError: starting from step 0 would overwrite the
    draft that was trained."""
    d = out_dir / "checkpoints"
    p = d / "latest"
    steps = sorted(d.glob("step-*.pt"))
    named = d / p.read_text().strip() if p.is_file() else None
    if named is not None and named.is_file():
        return named
    if steps:
        return steps[-1]
    if named is not None:
        raise ConfigError(
            f"{p} names {named.name}, which no longer exists, and {d} holds no other checkpoint: restore it "
            f"to resume, or delete {d} to train this draft again from the start."
        )
    return None


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


# The train.* settings that change what a checkpoint's weights mean (the norm options) or which of them train
# (freeze_lm_head): a run resumes only with the ones it was trained with.
DRAFT_SETTINGS = ("norm_before_fc", "norm_before_residual", "norm_output", "freeze_lm_head")


def draft_settings(tc) -> dict:
    return {key: bool(getattr(tc, key)) for key in DRAFT_SETTINGS}


def check_resume_settings(ckpt: dict, out: Path, tc) -> None:
    """Refuse to resume a checkpoint with other DRAFT_SETTINGS than it was trained with (ConfigError, what to
    do). Checkpoints record them; for older ones the norm options come from out/draft_config.json (written at
    every start, from the settings the checkpoint then trained with) or, for norm_before_fc, the weights."""
    saved = dict(ckpt.get("draft_settings") or {})
    if not saved:
        prior = out / "draft_config.json"
        if prior.is_file():
            dc = json.loads(prior.read_text())
            saved = {k: bool(dc[k]) for k in DRAFT_SETTINGS if k in dc}
        saved.setdefault("norm_before_fc", "input_norm.weight" in ckpt["model"])
    wanted = draft_settings(tc)
    differ = {k: v for k, v in saved.items() if k in wanted and wanted[k] != v}
    if differ:
        trained = [f"train.{k}={str(v).lower()}" for k, v in differ.items()]
        asked = ", ".join(f"train.{k}={str(wanted[k]).lower()}" for k in differ)
        resume = " ".join(trained)
        raise ConfigError(
            f"{out}: the checkpoint was trained with {', '.join(trained)}, this run asks for {asked} "
            f"(eagle-batch's defaults changed with decision 0021): resume with {resume}, or start a new run "
            "(another train.name)"
        )

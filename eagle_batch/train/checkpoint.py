"""Checkpoint files and the RNG state a resume restores: RUN/train/<name>/checkpoints/step-XXXXXXXX.pt
(atomic rename, the last two kept) and checkpoints/latest naming the newest; the draft settings a resume
must keep.

A checkpoint is data, never code: a plain dict of tensors, numbers, strings, lists and dicts (the RNG states
too, as tensors), loaded with `torch.load(..., weights_only=True)`, which refuses any other pickled object.
The folder is 0700 and its files 0600 whatever the umask; `latest` names a step file of that folder and
nothing else (no path, no link leaving it); a folder, `latest` or step file that is a link, another user's
or writable by others is refused (eagle_batch.ownership)."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
from pathlib import Path

import numpy as np
import torch

from eagle_batch.config.load import ConfigError
from eagle_batch.ownership import check_private, open_private, private_dir, write_private


def rng_state() -> dict:
    """This process's RNG states as tensors and plain numbers (what weights_only=True loads back)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    st = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    n = st["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    py = st["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["internal"].tolist()), py["gauss"]))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


STEP_NAME = re.compile(r"step-[0-9]{8}\.pt")
CHECKPOINTS = "the draft's checkpoints"


def load_checkpoint(path: Path) -> dict:
    """A checkpoint as data: weights_only=True (no pickled object of any other kind is built), from a file
    this user owns and alone can write; a ConfigError naming it otherwise."""
    check_private(path.parent, CHECKPOINTS)
    check_private(path, "a checkpoint of the draft")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"{path} is not a plain checkpoint (tensors, numbers, strings): it holds other pickled objects, "
            f"which eagle-batch does not load ({first[:200]}). A checkpoint eagle-batch wrote never does: "
            "delete it (and checkpoints/latest) to train again from the previous one or from the start."
        ) from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "step" not in ckpt:
        raise ConfigError(f"{path} is not an eagle-batch checkpoint (no model weights and step); delete it.")
    return ckpt


def _named_by_latest(d: Path, p: Path) -> Path | None:
    """The step file `latest` names: a bare step-XXXXXXXX.pt of this folder, else a ConfigError."""
    check_private(p, "the draft's latest-checkpoint pointer")
    name = p.read_text().strip()
    if not STEP_NAME.fullmatch(name):
        raise ConfigError(
            f"{p} names {name[:100]!r}, not a step-XXXXXXXX.pt file of {d}: it may only name a checkpoint "
            f"of its own folder. Write the newest step file's name into it, or delete it."
        )
    return d / name


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The checkpoint a training resumes from: the one checkpoints/latest names, else the newest step-*.pt (a
    crash between the two renames of save_checkpoint); None when there is none. A `latest` naming a file that
    no longer exists, with no other checkpoint, is a ConfigError: starting from step 0 would overwrite the
    draft that was trained."""
    d = out_dir / "checkpoints"
    p = d / "latest"
    check_private(d, CHECKPOINTS)
    steps = sorted(s for s in d.glob("step-*.pt") if STEP_NAME.fullmatch(s.name))
    named = _named_by_latest(d, p) if p.exists() or p.is_symlink() else None
    if named is not None and (named.is_file() or named.is_symlink()):
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
    d = private_dir(out_dir / "checkpoints", CHECKPOINTS)
    name = f"step-{state['step']:08d}.pt"
    tmp = d / (name + ".tmp")
    with os.fdopen(open_private(tmp), "wb") as f:
        torch.save(state, f)
    os.replace(tmp, d / name)
    write_private(d / "latest", name + "\n")
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

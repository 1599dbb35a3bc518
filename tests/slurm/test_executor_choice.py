"""`slurm.executor=auto` submits to Slurm only when a controller answers, not merely when sbatch exists."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from eagle_batch.config.schema import RunConfig
from eagle_batch.launch.submit import SubmitError, resolve_executor


def _fake_slurm_bin(tmp_path: Path, ping_out: str, ping_rc: int) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "squeue"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho '{ping_out}'\nexit {ping_rc}\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _cfg(executor: str) -> RunConfig:
    cfg = RunConfig()
    cfg.slurm.executor = executor
    return cfg


@pytest.mark.parametrize(
    "ping_out,ping_rc,expected",
    [
        ("Slurmctld(primary) at head is UP", 0, "slurm"),
        ("Slurmctld(primary) at head is DOWN", 1, "local"),
    ],
)
def test_auto_needs_a_controller(tmp_path, monkeypatch, ping_out, ping_rc, expected):
    monkeypatch.setenv("PATH", f"{_fake_slurm_bin(tmp_path, ping_out, ping_rc)}{os.pathsep}/usr/bin:/bin")
    assert resolve_executor(_cfg("auto")) == expected


def test_auto_without_sbatch_is_local(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve_executor(_cfg("auto")) == "local"


def test_explicit_slurm_without_sbatch_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SubmitError, match="slurm.executor=local"):
        resolve_executor(_cfg("slurm"))

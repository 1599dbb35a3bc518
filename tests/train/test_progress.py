"""Training progress (issue 21): a tqdm bar on a terminal, one plain line per logged step otherwise,
nothing with train.progress=false / --no-progress. Each case trains a tiny draft in a child process whose
stderr is a pseudo-terminal or a pipe."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

CHILD = r"""
import sys
from conftest import TINY, TINY_LAYERS, tiny_cfg
from helpers import random_samples
from eagle_batch.train.data import InMemoryDataset
from eagle_batch.train.trainer import train

run_dir, target, *extra = sys.argv[1:]
ds = InMemoryDataset(random_samples(40, TINY_LAYERS, TINY["hidden"], TINY["vocab"]), TINY_LAYERS)
r = train(tiny_cfg(run_dir, target, "train.steps=6", "train.log_every=2", *extra), dataset=ds)
print(r["status"])
"""


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _run_piped(tmp_path: Path, target: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", CHILD, str(tmp_path / "run"), str(target), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=HERE, timeout=600)


def test_progress_lines_when_not_a_terminal(tmp_path, fake_target):
    r = _run_piped(tmp_path, fake_target)
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("train: step ")]
    # log steps: 1 (the first), 2, 4, 6
    assert [x.split()[2] for x in lines] == ["1/6", "2/6", "4/6", "6/6"], r.stderr
    assert all("loss " in x and "tok/s" in x and "ETA" in x for x in lines)
    assert "\r" not in r.stderr  # no redrawn bar in a log file
    assert "draft vocabulary:" in r.stderr and "done at step 6/6" in r.stderr


def test_progress_off(tmp_path, fake_target):
    r = _run_piped(tmp_path, fake_target, "train.progress=false")
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), r.stdout + r.stderr
    assert "train:" not in r.stderr and "\r" not in r.stderr
    metrics = (tmp_path / "run" / "train" / "draft" / "metrics.jsonl").read_text().splitlines()
    assert len([x for x in metrics if '"loss"' in x]) == 4  # the metrics are still written


def test_progress_bar_on_a_terminal(tmp_path, fake_target):
    master, slave = pty.openpty()
    cmd = [sys.executable, "-c", CHILD, str(tmp_path / "run"), str(fake_target)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=_env(), cwd=HERE)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out, _ = proc.communicate(timeout=600)
    tty = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0 and out.decode().strip().endswith("done"), tty
    assert "\r" in tty  # redrawn in place
    assert "6/6" in tty and "step" in tty  # tqdm: n/total and the unit
    assert "loss " in tty and "tok/s" in tty  # the log step's postfix
    assert "train: step " not in tty  # no plain lines on a terminal


def test_cli_no_progress_flag(tmp_path):
    from test_cli_export import _train_config

    run_dir, conf = _train_config(tmp_path, {"steps": 2, "num_workers": 0, "tensorboard": False})
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    base = [sys.executable, "-m", "eagle_batch.cli", "train", str(conf), "train.log_every=1", "--local"]
    loud = subprocess.run(base, capture_output=True, text=True, env=env, cwd=ROOT)
    assert loud.returncode == 0, loud.stderr
    assert "train: step 2/2" in loud.stderr
    quiet = subprocess.run(base + ["--no-progress"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert quiet.returncode == 0, quiet.stderr
    assert "train:" not in quiet.stderr
    assert json.loads(quiet.stdout.strip().splitlines()[-1])["status"] == "done"

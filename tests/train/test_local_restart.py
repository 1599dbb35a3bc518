"""`eagle-batch train --local` survives crashes of its trainer (launch/local_train.py): a rank killed by a
signal is started again from the last checkpoint, up to train.max_restarts times; the crash after that
ends the command with the checkpoint to resume from, and the next command resumes from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from conftest import write_fake_target
from test_cli_export import ROOT, _train_config

from eagle_batch.launch.local_train import _crash_of

# Runs in the test half that starts the vLLM engines (scripts/test.sh): evens the two halves' wall time.
pytestmark = pytest.mark.engine_half


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(x) for x in (task / "children").read_text().split()]
    return kids


def _rank_process(cli_pid: int, not_this: int = 0, timeout: float = 120) -> int:
    """The spawned trainer child of the CLI process (not multiprocessing's resource tracker)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for kid in _children(cli_pid):
            try:
                cmd = Path(f"/proc/{kid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if kid != not_this and b"spawn_main" in cmd and b"resource_tracker" not in cmd:
                return kid
        time.sleep(0.2)
    raise AssertionError("no trainer child process appeared")


def latest_step(out: Path) -> int:
    """The step of the draft's checkpoints/latest (0 before the first checkpoint)."""
    latest = out / "checkpoints" / "latest"
    return int(latest.read_text().strip().split("-")[-1].split(".")[0]) if latest.is_file() else 0


def _wait_for_checkpoint(out: Path, after_step: int, proc: subprocess.Popen, timeout: float = 240) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        step = latest_step(out)
        if step > after_step:
            return step
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint past step {after_step} (command ended: {proc.poll()})")


def _events(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "event" in r]


def test_a_killed_trainer_restarts_from_its_checkpoint_then_gives_up_naming_it(tmp_path):
    steps = 400
    run_dir, conf = _train_config(
        tmp_path,
        {"steps": steps, "num_workers": 0, "tensorboard": False, "checkpoint_every": 5, "max_restarts": 1},
    )
    out = run_dir / "train" / "draft"
    cmd = [sys.executable, "-m", "eagle_batch.cli", "train", str(conf), "--local", "--no-progress"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        # First crash: the abort a CUDA fault ends in (std::terminate -> SIGABRT), after a checkpoint.
        first = _rank_process(proc.pid)
        at = _wait_for_checkpoint(out, 0, proc)
        os.kill(first, signal.SIGABRT)
        # The restarted rank resumes; once it has checkpointed past the first crash, kill it again.
        second = _rank_process(proc.pid, not_this=first)
        _wait_for_checkpoint(out, at, proc)
        os.kill(second, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 1, stdout + stderr
    # The command's own last line (multiprocessing's resource tracker may warn after it about a semaphore
    # the killed rank held).
    last_line = [x for x in stderr.splitlines() if x.startswith("eagle-batch train:")][-1]
    assert last_line.startswith("eagle-batch train: the trainer of") and "crashed 2 time(s)" in last_line
    assert "signal SIGKILL" in last_line and "checkpoints/step-" in last_line and "resumes from it" in last_line
    assert "restarting (1 of 1)" in stderr and "signal SIGABRT" in stderr
    assert "Traceback" not in stderr
    ev = _events(out)
    restarts = [e for e in ev if e["event"] == "restart"]
    assert len(restarts) == 1 and "SIGABRT" in restarts[0]["why"]
    starts = [e for e in ev if e["event"] == "start"]
    assert [s["resumed_from"] is None for s in starts] == [True, False]
    assert starts[1]["step"] >= at  # resumed from the checkpoint written before the crash, not from 0

    # What the message promises: the same command resumes from the last checkpoint and finishes.
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "done" and result["step"] == steps
    starts = [e for e in _events(out) if e["event"] == "start"]
    assert len(starts) == 3 and starts[2]["resumed_from"] and starts[2]["step"] > at
    assert (out / "export" / "model.safetensors").is_file()


def test_a_bad_input_in_the_trainer_child_is_one_line_and_not_retried(tmp_path):
    """A ConfigError only the trainer can raise (data of another model: the check reads the stores, in the
    rank process) comes back to the CLI as itself: one line, no traceback, no restart."""
    run_dir, conf = _train_config(tmp_path, {"steps": 2, "num_workers": 0, "max_restarts": 3})
    other = write_fake_target(tmp_path / "other-target")
    raw = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**raw, "hidden_size": 2 * raw["hidden_size"]}))
    cmd = [sys.executable, "-m", "eagle_batch.cli", "train", str(conf), f"model.path={other}", "--local"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run(cmd + ["--no-progress"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "restarting" not in r.stderr, r.stderr
    said = [x for x in r.stderr.splitlines() if x.startswith("eagle-batch train:")]
    assert len(said) == 1 and "configuration error" in said[0] and "hidden states of another model" in said[0]


@pytest.mark.parametrize(
    ("text", "restartable"),
    [
        ("torch.AcceleratorError: CUDA error: unspecified launch failure", True),
        ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error", True),
        ("RuntimeError: DataLoader worker (pid 5262) is killed by signal: Aborted.", True),
        ("RuntimeError: DataLoader worker (pid(s) 5262, 5263) exited unexpectedly", True),
        ("ValueError: Caught ValueError in DataLoader worker process 0.", False),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", False),
        ("ValueError: too many values to unpack", False),
    ],
)
def test_which_exceptions_of_a_rank_are_worth_a_restart(text, restartable):
    crash = _crash_of(
        mp.ProcessRaisedException(f"\n\n-- Process 0 terminated with the following error:\n{text}\n", 0, 1)
    )
    assert crash.restartable is restartable and crash.why == f"rank 0 raised {text}"

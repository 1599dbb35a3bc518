"""A training submitted to the real local Slurm (launch/train_job.py) on one node runs its rank as a child
of the Slurm task (launch/local_train.py): the checkpoint signal, which Slurm sends to every process of the
step, kills none of the task's children and reaches the rank, which checkpoints and is requeued; a rank
that crashes is started again inside the same job. Both resume from the last checkpoint, and the training
finishes at the planned step."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli_export import ROOT, _train_config
from test_local_restart import _events, latest_step


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)


def _rank_of_job(job_id: str, not_this: int = 0, timeout: float = 180) -> int:
    """The trainer rank (a spawned child) running in Slurm job `job_id` (an array's base id or a job id)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == not_this:
                continue
            try:
                cmd = (d / "cmdline").read_bytes()
                if b"spawn_main" not in cmd or b"resource_tracker" in cmd:
                    continue
                env = _environ(int(d.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            if job_id in (env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_JOB_ID")):
                return int(d.name)
        time.sleep(0.2)
    raise AssertionError(f"no trainer rank of Slurm job {job_id} appeared")


def _wait(what, check, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slurm
def test_a_slurm_training_is_requeued_at_the_signal_and_restarted_after_a_crash(tmp_path):
    steps = 1500  # ~10,000 tok/s on one CPU core: the signal and the crash land mid-run
    run_dir, conf = _train_config(
        tmp_path,
        {"steps": steps, "num_workers": 1, "tensorboard": False, "checkpoint_every": 5, "max_restarts": 1},
        slurm={"executor": "slurm", "gpus_per_node": 0, "cpus_per_task": 1, "time_min": 20, "signal_delay_s": 5},
    )
    out = run_dir / "train" / "draft"
    r = subprocess.run(
        [sys.executable, "-m", "eagle_batch.cli", "train", str(conf)], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0 and "submitted 1 training task(s)" in r.stdout, r.stdout + r.stderr
    job = re.search(r"training task\(s\): (\d+)", r.stdout).group(1)  # "123" or an array's "123_0"
    try:
        # The checkpoint signal (as before the time limit): every process of the step gets it, the rank too.
        first = _rank_of_job(job)
        _wait("a first checkpoint", lambda: latest_step(out) > 0)
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        _wait("the requeued task's start", lambda: len([e for e in _events(out) if e["event"] == "start"]) == 2)
        # A crash of the requeued task's rank (the abort a CUDA fault ends in), after it has checkpointed.
        resumed_at = latest_step(out)
        second = _rank_of_job(job, not_this=first)
        _wait("a checkpoint of the requeued task", lambda: latest_step(out) > resumed_at)
        os.kill(second, signal.SIGABRT)
        result = run_dir / "train" / "draft" / "result.json"
        _wait("the training's result", result.is_file, timeout=600)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    logs = "\n".join(p.read_text() for p in (run_dir / "slurm").rglob("*.err"))
    assert json.loads(result.read_text())["status"] == "done", logs
    ev = _events(out)
    assert [e["event"] for e in ev if e["event"] != "restart"][:2] == ["start", "stopped"], ev
    restarts = [e for e in ev if e["event"] == "restart"]
    assert len(restarts) == 1 and "SIGABRT" in restarts[0]["why"], ev  # the signal itself killed no rank
    starts = [e for e in ev if e["event"] == "start"]
    assert len(starts) == 3 and all(s["resumed_from"] for s in starts[1:]) and starts[2]["step"] > starts[1]["step"]
    assert ev[-1] == {**ev[-1], "event": "done", "step": steps}
    assert "got SIGUSR2" in logs and "restarting (1 of 1)" in logs, logs
    # Nothing else the signal reached died of it: no data worker, no multiprocessing resource tracker.
    assert "died unexpectedly" not in logs and "DataLoader worker" not in logs, logs
    assert (out / "export" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("nodes", "expect"),
    [
        (1, {"--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=32", "--gpus-per-node=8"}),
        (2, {"--nodes=2", "--ntasks-per-node=8", "--cpus-per-task=4", "--gpus-per-node=8"}),
    ],
)
def test_one_node_trains_as_one_task_with_every_ranks_cpus_several_nodes_as_one_task_per_rank(tmp_path, nodes, expect):
    from eagle_batch.config import load_config
    from eagle_batch.launch.train_job import training_executor

    overrides = [f"run_dir={tmp_path / 'r'}", "model.path=/models/m", "slurm.cpus_per_task=4", f"slurm.nodes={nodes}"]
    cfg = load_config(None, overrides)
    ex, child_ranks = training_executor(cfg, tmp_path / "r", check_fits=False)
    script = ex._make_submission_file_text(ex._submitit_command_str, "x")
    assert child_ranks == (8 if nodes == 1 else 0)
    assert {line for line in expect if f"#SBATCH {line}\n" in script + "\n"} == expect, script


@pytest.mark.slurm
def test_a_three_task_sweep_on_slurm_trains_three_drafts_from_one_store_and_ranks_them(tmp_path):
    """`train.sweep` as one Slurm array over one task store: each task trains and exports its own draft,
    scores it on the same held-out samples, and `eagle-batch drafts RUN` ranks them."""
    run_dir, conf = _train_config(
        tmp_path,
        {
            "steps": 30,
            "num_workers": 0,
            "tensorboard": False,
            "holdout_fraction": 0.2,
            "max_restarts": 0,
            "sweep": [{"train.lr": 1e-4}, {"train.lr": 3e-3}, {"train.lr": 3e-3, "train.ttt_steps": 3}],
        },
        slurm={"executor": "slurm", "gpus_per_node": 0, "cpus_per_task": 1, "time_min": 20},
    )
    r = subprocess.run(
        [sys.executable, "-m", "eagle_batch.cli", "train", str(conf)], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0 and "submitted 3 training task(s)" in r.stdout, r.stdout + r.stderr
    jobs = re.findall(r"(\d+_\d+)", r.stdout)
    results = [run_dir / "train" / f"draft-{i}" / "result.json" for i in range(3)]
    try:
        _wait("three finished drafts", lambda: all(p.is_file() for p in results), timeout=600)
    finally:
        subprocess.run(["scancel", *{j.split("_")[0] for j in jobs}], capture_output=True)
    held = [json.loads(p.read_text())["heldout"] for p in results]
    assert len({h["samples"] for h in held}) == 1 and held[0]["samples"] > 0  # the same held-out samples
    for i in range(3):
        assert (run_dir / "train" / f"draft-{i}" / "export" / "model.safetensors").is_file()
    ranked = subprocess.run(
        [sys.executable, "-m", "eagle_batch.cli", "drafts", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert ranked.returncode == 0, ranked.stderr
    rows = [json.loads(x) for x in ranked.stdout.splitlines()]
    assert sorted(r["name"] for r in rows) == ["draft-0", "draft-1", "draft-2"]
    accs = [r["heldout_acceptance_length"] for r in rows]
    assert accs == sorted(accs, reverse=True) and all(a >= 1.0 for a in accs)
    table = subprocess.run(
        [sys.executable, "-m", "eagle_batch.cli", "drafts", str(run_dir)], capture_output=True, text=True, cwd=ROOT
    )
    assert table.stdout.splitlines()[1].split()[1] == rows[0]["name"], table.stdout

"""A full disk as a user meets it, through the CLI only: the whole run folder on a small tmpfs that the
task store fills mid-run (needs mount permission, as root in CI; skipped with the reason elsewhere).

extract is refused with real figures and advice that works as printed -> the advised command runs and the
task stops on the full disk, recording where and at which sample -> `status` says so -> `resume` on the
disk still full refuses in one line naming the folder and the space needed -> the tmpfs is grown ->
`resume --wait` completes with every committed sample kept bit for bit -> `verify` passes. No output of
the sequence holds a traceback. The local executor and the `hf` backend keep it free of Slurm and vLLM.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_run import run_cli as cli

# Runs in the test half that starts the vLLM engines (scripts/test.sh): evens the two halves' wall time.
pytestmark = pytest.mark.engine_half

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "configs" / "data" / "demo-chat.jsonl"
# 20 chats of ~1,260 tokens in all: 1.9 MB of bf16 states for the tiny Llama, 1.2 MB at the best compression
# the disk check assumes; 900 kB holds the prepared data, the logs and about a third of the store.
TMPFS_SIZE = "900k"


def _mount_tmpfs(path: Path, size: str) -> str | None:
    if shutil.which("mount") is None:
        return "no mount command here"
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    return None if r.returncode == 0 else f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); needs root"


def _said(r: subprocess.CompletedProcess) -> str:
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out[-3000:]
    return out


def _committed(store: Path) -> tuple[list[str], list[bytes]]:
    import torch

    from eagle_batch.store import open_dataset

    ds = open_dataset(store)
    items = [ds[i] for i in range(len(ds))]
    return [x["sample_id"] for x in items], [x["hidden_states"].view(torch.int16).numpy().tobytes() for x in items]


@pytest.fixture()
def run_on_tmpfs(tmp_path, tiny_model):
    run = tmp_path / "run"
    run.mkdir()
    why = _mount_tmpfs(run, TMPFS_SIZE)
    if why:
        pytest.skip(why)
    cfg = {
        "run_dir": str(run),
        "model": {"path": str(tiny_model("llama")), "max_model_len": 512, "dtype": "float32"},
        "data": {"inputs": [str(DATA)], "format": "messages", "max_length": 256, "limit": 20},
        # a commit after every sample: the disk fills between commits, many samples in
        "extract": {"num_tasks": 1, "backend": "hf", "batch_samples": 1, "commit_interval_s": 0},
        "store": {"chunk_tokens": 16, "shard_tokens": 64},
        "slurm": {"executor": "local", "gpus_per_node": 0, "max_attempts": 2},
    }
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(cfg))
    try:
        yield run, config
    finally:
        subprocess.run(["umount", "-l", str(run)], capture_output=True)


def test_full_disk_from_extract_to_verify(run_on_tmpfs):
    run, config = run_on_tmpfs
    assert cli("prepare", config, "--no-progress", "--workers", "1").returncode == 0
    stores = run / "stores"

    # 1. The pre-flight check: real figures in readable units, and advice that is then followed as printed.
    r = cli("extract", config)
    said = _said(r)
    assert r.returncode == 2, said
    assert f"{stores}: 1,26" in said and "Nothing was submitted" in said and "0.0 GB" not in said
    assert re.search(r"take \d\.\d\d MB raw and at least \d\.\d\d MB compressed", said), said
    assert re.search(rf"its filesystem \({run}\) has \d+ kB free", said), said
    assert "adding extract.check_disk=false to this command submits anyway" in said
    r = cli("extract", config, "extract.check_disk=false", "--wait", "--interval", "0.5")
    said = _said(r)
    assert r.returncode == 1, said  # the run did not finish
    assert "another run" not in said and "no_space=1" in said

    # 2. The task recorded the full disk, where and at which sample; nothing retried it.
    state = json.loads((run / "state" / "task-00000.json").read_text())
    n = state["samples_committed"]
    assert state["status"] == "no_space" and len(state["attempts"]) == 1 and 0 < n < 20, state
    r = cli("status", run)
    said = _said(r)
    assert re.search(r"\n\s+0 no_space ", said), said
    assert f"stopped: no space left on device in {stores} at sample {n + 1} of 20" in said
    assert f"eagle-batch resume {run}" in said and "killed" not in said and "Slurm" not in said
    ids_before, states_before = _committed(stores / "task-00000.zarr")
    assert len(ids_before) == n

    # 3. resume on the disk still full: one line, the folder and the space to free; nothing submitted.
    subs = (run / "slurm" / "submissions.jsonl").read_text()
    r = cli("resume", run)
    said = _said(r)
    assert r.returncode == 2 and len(said.strip().splitlines()) == 1, said
    assert str(stores) in said and "Nothing was submitted" in said
    assert re.search(rf"Free at least \d+(\.\d+)? [kM]B there, then `eagle-batch resume {run}` again", said), said
    assert (run / "slurm" / "submissions.jsonl").read_text() == subs

    # 4. Space freed: resume completes; the samples committed before the disk filled are there, bit for bit.
    subprocess.run(["mount", "-o", "remount,size=16m", str(run)], check=True)
    r = cli("resume", run, "--wait", "--interval", "0.5")
    said = _said(r)
    assert r.returncode == 0, said
    assert "1/1 tasks done | 100.0% tokens" in said and "done=1" in said, said
    ids_after, states_after = _committed(stores / "task-00000.zarr")
    assert len(ids_after) == 20 and ids_after[:n] == ids_before and states_after[:n] == states_before
    r = cli("verify", run, "--no-progress")
    said = _said(r)
    assert r.returncode == 0 and "OK: 1 store(s), 20 samples verified" in said, said
    assert not (run / "state" / ".reserve-00000").exists()  # the attempt gave its reserve back

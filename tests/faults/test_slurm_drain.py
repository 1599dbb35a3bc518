"""Slurm: the node is drained in the middle of an extraction array, then resumed.

Beyond tests/slurm/test_slurm.py (cancel, time limit, give-up after max_attempts, whole-array requeue,
resume --repair, duplicates): a drain lets the running task finish, keeps the rest of the array pending
(nothing is lost or failed), and after `state=resume` every task completes with data identical to an
uninterrupted run. The node state is restored in a `finally`: other tests share this Slurm.
Uses the synthetic work of tests/slurm/work.py (real ArrayTask, state files and store writer).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.slurm.test_slurm import (
    assert_same_data,
    cli,
    make_synthetic_run,
    reference_run,  # noqa: E402
    status,
    wait_for,
    wait_idle,
)

pytestmark = pytest.mark.slurm


@pytest.fixture
def synthetic_work(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def node_name() -> str:
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True)
    nodes = r.stdout.split()
    return nodes[0] if len(nodes) == 1 else socket.gethostname().split(".")[0]


def node_state(node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def test_node_drain_mid_array_then_resume_completes(tmp_path, capsys, synthetic_work):
    n = 2
    ref = reference_run(tmp_path, n)
    # One task at a time: when the node is drained, task 0 runs and task 1 is still pending.
    run, cfg = make_synthetic_run(tmp_path, "drain", n, array_parallelism=1)
    (run / "faults" / "sleep_s").write_text("0.5")
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 0, err
    node = node_name()
    wait_for(
        lambda: (s := status(capsys, run)["tasks"])[0]["state"] == "running" and s[0]["samples_committed"] >= 1,
        120,
        "task 0 running with a commit",
    )
    drained = False
    try:
        r = subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=drain", "reason=eagle-batch-fault-test"],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot drain node {node}: {r.stderr.strip()}")
        drained = True
        # The running task finishes on the draining node; the pending one is not started.
        wait_for(lambda: status(capsys, run)["tasks"][0]["state"] == "done", 120, "task 0 done on the draining node")
        t0 = time.time()
        while time.time() - t0 < 8:
            st = status(capsys, run)
            assert st["tasks"][1]["state"] == "pending", json.dumps(st["tasks"][1])
            time.sleep(1)
        assert "drain" in node_state(node).lower(), node_state(node)
    finally:
        if drained:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True, text=True)
    (run / "faults" / "sleep_s").write_text("0")
    st = wait_idle(capsys, run, 180)
    assert st["totals"]["all_done"], json.dumps(st, indent=1)
    s1 = json.loads((run / "state" / "task-00001.json").read_text())
    assert [a["outcome"] for a in s1["attempts"]] == ["done"] and s1["failures"] == 0
    assert_same_data(run, ref, n)

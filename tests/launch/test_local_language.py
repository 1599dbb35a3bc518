"""The local executor in its own words, through the CLI: Ctrl-C on `extract --wait` says the tasks go on and
how to follow or stop them (exit 130, no traceback); `cancel` stops the running tasks' process groups and says
how many; `status` of a local run never speaks of Slurm; without RUN/state the stores say where each task
stands (done, partial, missing), never `failed`.

The tasks run `tests.slurm.work:synthetic_work` (the real store writer, no model) on the local executor.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.test_local_executor import REPO, cli, make_run, no_traceback, status, wait_for

# Runs in the test half that starts the vLLM engines (scripts/test.sh): evens the two halves' wall time.
pytestmark = pytest.mark.engine_half


def _extract_wait_in_a_terminal_group(cfg: Path) -> subprocess.Popen:
    """`extract --wait` as a shell starts it: leading the terminal's foreground process group, which Ctrl-C
    signals as a whole, with SIGINT at its default action. The test process may have SIGINT ignored (a
    background job of a non-interactive shell, as each half of scripts/test.sh is), and exec keeps an ignored
    signal ignored: SIGINT gets a handler here for the fork, which exec resets to the default."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "eagle_batch.cli", "extract", str(cfg), "--wait", "--interval", "0.3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONFAULTHANDLER="1"),
            cwd=str(REPO),
            start_new_session=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)


def _output_after_ctrl_c(p: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    """What `--wait` printed once it ended; if it has not ended in `timeout`, a failure that says where it was
    (its threads' stacks, PYTHONFAULTHANDLER on SIGABRT) or, if it did exit, which processes hold its pipes."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        exited = p.poll() is not None
        ps = subprocess.run(["ps", "-eo", "pid,ppid,pgid,sid,stat,args"], capture_output=True, text=True).stdout
        if not exited:
            p.send_signal(signal.SIGABRT)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        pytest.fail(
            f"`extract --wait` {'exited but its pipes stayed open' if exited else 'did not end'} {timeout:.0f} s "
            f"after Ctrl-C\nstderr:\n{err[-8000:]}\nstdout tail:\n{out[-1500:]}\nprocesses:\n{ps}"
        )


def test_ctrl_c_cancel_and_status_of_a_local_run_then_state_rebuilt_from_the_stores(tmp_path):
    run, cfg = make_run(tmp_path, 2, gpus_per_node=0)
    (run / "faults" / "sleep_s").write_text("3")  # 12 samples: ~36 s per task, time for the commands below
    env: dict = {}

    # Ctrl-C on --wait: one line, the tasks go on, how to follow and stop them; exit 130.
    p = _extract_wait_in_a_terminal_group(cfg)
    wait_for(lambda: status(run, env)["tasks"][0]["samples_committed"] >= 1, 120, "task 0 to commit")
    os.killpg(p.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    out, err = _output_after_ctrl_c(p)
    assert p.returncode == 130, out + err
    assert "Traceback" not in out + err, err
    (line,) = err.strip().splitlines()
    assert "go on in the background on this machine (local job local-" in line, line
    assert f"`eagle-batch status {run}`" in line and f"`eagle-batch cancel {run}`" in line, line
    st = status(run, env)
    assert st["tasks"][0]["state"] == "running", st["tasks"]  # the tasks did go on

    # cancel: the running task's process group is stopped, and cancel says how many tasks it stopped.
    r = cli("cancel", run, env=env)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert "cancelled local job local-" in r.stdout and "1 running task(s) stopped (0)" in r.stdout, r.stdout
    assert "1 not started will not start" in r.stdout and f"eagle-batch resume {run}" in r.stdout, r.stdout
    st = status(run, env)
    assert [t["state"] for t in st["tasks"]] == ["cancelled", "cancelled"], st["tasks"]
    assert st["totals"]["active"] == 0
    r = cli("status", run, env=env)
    no_traceback(r)
    assert "stopped by `eagle-batch cancel`" in r.stdout and "Slurm" not in r.stdout + r.stderr, r.stdout
    r = cli("cancel", run, env=env)
    assert r.returncode == 0 and f"nothing of {run} is queued or running." in r.stdout, r.stdout
    assert "Slurm" not in r.stdout + r.stderr
    committed = json.loads((run / "state" / "task-00000.json").read_text())["samples_committed"]
    assert 0 < committed < 12

    # RUN/state deleted: task 0's store is partial, task 1 never wrote one: named so, nothing `failed`.
    shutil.rmtree(run / "state")
    r = cli("status", run, env=env)
    no_traceback(r)
    rows = {t["task_id"]: t for t in status(run, env)["tasks"]}
    assert rows[0]["state"] == "partial" and rows[0]["samples_committed"] == committed, rows[0]
    assert "task-00000.json is missing; its store" in rows[0]["last_error"]
    assert rows[1]["state"] == "missing" and "task-00001.json is missing" in rows[1]["last_error"], rows[1]
    assert "failed" not in r.stdout and "Slurm" not in r.stdout, r.stdout

    # resume takes both; once done, deleting RUN/state again leaves both `done` (the complete markers).
    (run / "faults" / "sleep_s").write_text("0")
    r = cli("resume", run, "--wait", "--interval", "0.3", env=env)
    no_traceback(r)
    assert r.returncode == 0 and "resubmitting 2 task(s): 0, 1" in r.stdout, r.stdout + r.stderr
    shutil.rmtree(run / "state")
    st = status(run, env)
    assert [t["state"] for t in st["tasks"]] == ["done", "done"] and st["totals"]["all_done"], st["tasks"]
    assert st["totals"]["samples_committed"] == 24

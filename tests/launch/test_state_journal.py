"""The state journal and the `--wait` follower: a poll re-reads only what changed, and whatever the journal
cannot vouch for (a torn line, a rotation, a task killed between its state write and its journal line, a
writer killed -9 in the middle) ends in a full read, so the follower always ends up showing the state files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from eagle_batch.bench.oscalls import MetadataCalls
from eagle_batch.bench.scale_run import RunShape, build_run
from eagle_batch.launch import state as S
from eagle_batch.launch import state_journal
from eagle_batch.launch.follow import Follower
from eagle_batch.launch.status import run_status


def _rows(status: dict) -> list[dict]:
    return [{k: v for k, v in r.items()} for r in status["tasks"]]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("journal") / "run"
    build_run(path, 30, RunShape(written_stores=3, failed_fraction=0.05, missing_fraction=0.05))
    return path


def _bump(run, t: int, tok_s: float) -> None:
    st = S.read_state(run, t)
    st.tok_s = tok_s
    # What a row shows of it whatever the task's state (a done task's rate is its attempts' average).
    st.last_error = f"rate {tok_s}"
    S.write_state(run, st)


def test_write_state_appends_one_line_per_write(run):
    path = state_journal.journal_path(run / S.STATE_DIR)
    before = path.stat().st_size
    _bump(run, 0, 11.0)
    lines = path.read_bytes()[before:].splitlines()
    assert len(lines) == 1
    d = json.loads(lines[0])
    assert d["task_id"] == 0 and d["last_error"] == "rate 11.0" and "history" not in d["extra"]


def test_idle_poll_is_one_stat_and_changes_are_read_from_the_journal(run):
    follower = Follower(run)
    follower.poll()
    with MetadataCalls() as idle:
        follower.tail.news()
    assert idle.counts == {"stat": 1}
    _bump(run, 3, 42.0)
    _bump(run, 4, 43.0)
    with MetadataCalls() as busy:
        status = follower.poll()
    # No per-task read (this run has 30 tasks): the changed states come in the journal's bytes; the opens are
    # the journal, the plan, the submissions and the config.
    assert busy.counts.get("io.open", 0) + busy.counts.get("builtins.open", 0) <= 8
    rows = {r["task_id"]: r for r in status["tasks"]}
    assert rows[3]["last_error"] == "rate 42.0" and rows[4]["last_error"] == "rate 43.0"
    assert _rows(status) == _rows(run_status(run))


def test_torn_line_makes_the_follower_read_every_state_file(run):
    follower = Follower(run)
    follower.poll()
    path = state_journal.journal_path(run / S.STATE_DIR)
    with open(path, "ab") as f:  # what a task killed in the middle of its append leaves
        f.write(b'{"task_id": 5, "status": "ru')
    _bump(run, 6, 77.0)  # the next task's line lands after the torn bytes
    last_full = follower.last_full
    status = follower.poll()
    assert follower.last_full > last_full  # the torn line made this poll a full read
    assert {r["task_id"]: r for r in status["tasks"]}[6]["last_error"] == "rate 77.0"
    assert _rows(status) == _rows(run_status(run))
    _bump(run, 7, 78.0)  # past the torn line, the journal is news again
    assert set(follower.tail.news()) == {7}


def test_state_written_without_its_line_is_caught_by_the_full_read(run):
    follower = Follower(run)
    follower.poll()
    st = S.read_state(run, 8)
    st.tok_s = 99.0
    st.last_error = "rate 99.0"
    p = S.state_path(run, 8)  # a task killed between its state write and its journal line
    p.write_text(json.dumps(st.to_json()))
    status = follower.poll()
    assert {r["task_id"]: r for r in status["tasks"]}[8]["last_error"] != "rate 99.0"  # the journal said nothing yet
    follower.last_full -= follower.full_every_s  # the full read is due
    status = follower.poll()
    assert {r["task_id"]: r for r in status["tasks"]}[8]["last_error"] == "rate 99.0"


def test_rotation_makes_the_follower_read_everything_once(run, monkeypatch):
    follower = Follower(run)
    follower.poll()
    monkeypatch.setattr(state_journal, "ROTATE_BYTES", 1)
    _bump(run, 9, 55.0)  # this append rotates the journal
    path = state_journal.journal_path(run / S.STATE_DIR)
    assert not path.exists() and path.with_name(state_journal.JOURNAL_NAME + ".1").exists()
    monkeypatch.setattr(state_journal, "ROTATE_BYTES", 64 << 20)
    _bump(run, 10, 56.0)  # a new journal (another inode)
    last_full = follower.last_full
    status = follower.poll()
    assert follower.last_full > last_full  # the rotation made this poll a full read
    rows = {r["task_id"]: r for r in status["tasks"]}
    assert rows[9]["last_error"] == "rate 55.0" and rows[10]["last_error"] == "rate 56.0"


WRITER = """
import sys
from eagle_batch.launch import state as S
run, t = sys.argv[1], int(sys.argv[2])
st = S.read_state(run, t)
i = 0
print("ready", flush=True)
while True:
    i += 1
    st.tok_s = float(i)
    S.write_state(run, st)
"""


def test_writer_killed_mid_write_leaves_a_whole_state_file(run):
    """kill -9 a process that writes its state (and journal line) in a loop: the state file always parses,
    the journal's whole lines parse (a torn tail is left for the next append to end), and a follower's
    status equals a fresh one."""
    from eagle_batch.launch.run_view import RunListing

    task = max(RunListing.read(run).states)  # a task with a state file
    follower = Follower(run)
    follower.poll()
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for delay in (0.05, 0.11, 0.2):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run), str(task)], stdout=subprocess.PIPE, env=env)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        S.read_state(run, task)  # raises StateFileError if the file were torn
        journal = state_journal.journal_path(run / S.STATE_DIR).read_bytes()
        whole = journal[: journal.rfind(b"\n") + 1].splitlines()
        try:
            last = json.loads(whole[-1])
        except (IndexError, ValueError):  # a torn line an earlier kill left, ended by this writer's first append
            last = {}
        if last.get("tok_s") != S.read_state(run, task).tok_s:
            # Killed after its state write and before (or in the middle of) its line: the journal's last word
            # is the state before. The follower shows that until its next full read (or until the task's
            # Slurm job changes state); make the full read due now.
            follower.last_full -= follower.full_every_s
        status = follower.poll()
        assert _rows(status) == _rows(run_status(run))

"""Two writers on one task store, at the level of the real task: while one ArrayTask holds the store,
a second one (a duplicate job) refuses, writes nothing, and leaves the state file to the holder.

Store level: tests/store/test_writer_reader.py (StoreLockedError naming the holder, also across processes);
Slurm level: tests/slurm/test_slurm.py (a duplicate CLI submission and a raw duplicate job are refused).
"""

from __future__ import annotations

import json
import os
import signal
import time

import faultlib as F


def test_second_task_on_a_held_store_refuses_and_writes_nothing(faults_base, prepared, reference):
    run = F.copy_run(prepared, faults_base / "two-writers")
    store = F.store_of(run)
    holder = F.fork_task(run)
    try:
        t0 = time.monotonic()
        while F.lock_holder_pid(store) != holder:
            assert time.monotonic() - t0 < 120 and not os.waitpid(holder, os.WNOHANG)[0], F.child_stderr(run)
            time.sleep(0.01)
        os.kill(holder, signal.SIGSTOP)  # hold the lock, frozen: the store and state cannot change under us
        before = {p: p.read_bytes() for p in [*store.rglob("*"), *(run / "state").rglob("*")] if p.is_file()}
        dup_err = run / "task-0.child.err"
        dup_err.write_text("")
        dup = F.fork_task(run)
        assert F.wait_pid(dup) == 1
        err = dup_err.read_text()
        assert "DuplicateTaskError" in err and "already being written by another job" in err, err
        assert f"pid {holder}" in err and "wrote nothing" in err, err  # names the holder
        after = {p: p.read_bytes() for p in [*store.rglob("*"), *(run / "state").rglob("*")] if p.is_file()}
        assert after == before, "the refused duplicate changed the store or the state file"
    finally:
        os.kill(holder, signal.SIGCONT)
    assert F.wait_pid(holder) == 0, F.child_stderr(run)
    assert F.assert_same_store(store, reference) == 20
    st = json.loads((run / "state" / "task-00000.json").read_text())
    assert len(st["attempts"]) == 1 and st["status"] == "done"

"""Disk full during a write: a clear error naming the store and what to do, the committed part intact
(verify passes on it), and a resume after space is freed completes and equals the uninterrupted run.

Two ways to fill the disk: a real tiny tmpfs mounted over RUN/stores (needs root; skipped with the reason
otherwise), and an injected ENOSPC from os.write/os.writev inside the task process (runs anywhere).
"""

from __future__ import annotations

import json
import subprocess

import faultlib as F
import pytest


def _check_failed_attempt(run, reference):
    st = json.loads((run / "state" / "task-00000.json").read_text())
    err = st["last_error"]
    store = F.store_of(run)
    # The state says where the disk filled and at which sample, that committed data is kept, and what to do;
    # the task is not retried (every attempt would hit the same full disk).
    n = F.assert_committed_prefix(store, reference)  # verify passes on the committed part, bit-exact prefix
    assert n == st["samples_committed"]
    assert err.startswith(f"stopped: no space left on device in {store.parent} at sample {n + 1} of 20"), err
    assert "kept" in err and "free space" in err.lower() and "eagle-batch resume" in err, err
    assert st["status"] == "no_space" and st["attempts"][-1]["outcome"] == "no_space"
    assert not list(store.rglob("*.partial")), "the failed write left its temporary file behind"
    return n


def test_tmpfs_full_then_freed(faults_base, prepared, reference):
    run = F.copy_run(prepared, faults_base / "diskfull-tmpfs")
    stores = run / "stores"
    why = F.mount_tmpfs(stores, "700k")  # the whole store needs ~1.9 MB
    if why:
        pytest.skip(why)
    try:
        code, _ = F.run_forked(run)
        assert code == 1, "the task should fail when the disk is full"
        n = _check_failed_attempt(run, reference)
        assert 0 < n < 20, f"the fill level should stop the task mid-way (committed {n})"
        # Free space (grow the file system), resume: completes, identical to the uninterrupted run.
        subprocess.run(["mount", "-o", "remount,size=16m", str(stores)], check=True)
        code, _ = F.run_forked(run)
        assert code == 0, F.child_stderr(run)
        assert F.assert_same_store(F.store_of(run), reference) == 20
        assert F.store_of(run).joinpath("complete").is_file()
    finally:
        F.umount(stores)


def test_injected_enospc_then_resume(faults_base, prepared, reference):
    run = F.copy_run(prepared, faults_base / "diskfull-injected")
    pid = F.fork_task_with_disk_budget(run, 600_000)  # bytes the child may write before the "disk is full"
    assert F.wait_pid(pid) == 1
    n = _check_failed_attempt(run, reference)
    assert 0 < n < 20
    code, _ = F.run_forked(run)
    assert code == 0, F.child_stderr(run)
    assert F.assert_same_store(F.store_of(run), reference) == 20

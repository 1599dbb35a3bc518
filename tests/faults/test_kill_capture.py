"""SIGKILL the real task (prepared samples -> run_capture, hf backend -> TaskStoreWriter) at random points of
capture + write; every resume must give data bit-identical to an uninterrupted run, sample by sample.

CI runs 4 kills; `python tests/faults/run_all.py` runs >= 50 (docs/explanation/reliability.md, "Fault-injection suite").
The store-only SIGKILL trials are tests/store/test_kill.py; this adds the engine, the capture writer
thread, run_capture's skip-what-is-committed and the task's state file.
"""

from __future__ import annotations

import json

import faultlib as F
import pytest


def test_sigkill_during_capture_and_write_then_resume_is_bit_identical(faults_base, prepared, reference):
    res = F.kill_trials(faults_base / "kill", prepared, reference, trials=4, kills_per_run=2, seed=7)
    assert res["kills"] == 4 and res["data_lost_samples"] == 0
    assert res["samples_compared"] >= 20 * res["runs"]
    # At least one kill landed after something was committed and before the end: resume did real work.
    assert any(0 < c < 20 for c in res["committed_at_kill"]), res


def test_hf_float32_capture_is_deterministic_across_processes(faults_base, prepared, reference):
    """The premise of the bit-exact comparisons: a second, independent process gives the same bits."""
    run = F.copy_run(prepared, faults_base / "determinism")
    code, _ = F.run_forked(run)
    assert code == 0, F.child_stderr(run)
    assert F.assert_same_store(F.store_of(run), reference) == 20


@pytest.fixture(scope="module")
def reference_fp8(faults_base):
    """A float8 store (store.dtype float8_e4m3: the writer quantizes the hf backend's states), uninterrupted."""
    prepared = F.prepared_run(faults_base, "prepared-fp8", store={"dtype": "float8_e4m3"})
    run = F.copy_run(prepared, faults_base / "reference-fp8")
    code, _ = F.run_forked(run)
    assert code == 0, F.child_stderr(run)
    return prepared, F.store_of(run)


def test_sigkill_float8_store_then_resume_is_bit_identical(faults_base, reference_fp8):
    prepared, reference = reference_fp8
    assert json.loads((reference / "zarr.json").read_text())["attributes"]["eagle_batch"]["dtype"] == "float8_e4m3"
    res = F.kill_trials(faults_base / "kill-fp8", prepared, reference, trials=2, kills_per_run=2, seed=11)
    assert res["kills"] == 2 and res["data_lost_samples"] == 0
    assert res["samples_compared"] >= 20 * res["runs"]

"""Session fixtures of the fault-injection suite: one prepared run (20 demo chats, tiny Llama, hf backend in
float32) and its uninterrupted reference task store, shared by every fault test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import faultlib as F  # noqa: E402


@pytest.fixture(scope="session")
def faults_base(tmp_path_factory) -> Path:
    F.preload()
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="session")
def prepared(faults_base) -> Path:
    """config.yaml + prepared/ of a one-task run; copy it with F.copy_run before running anything in it."""
    return F.prepared_run(faults_base, "prepared")


@pytest.fixture(scope="session")
def reference(faults_base, prepared) -> Path:
    """The same task run once, uninterrupted: the store every faulted run must equal bit for bit."""
    run = F.copy_run(prepared, faults_base / "reference")
    code, _ = F.run_forked(run)
    assert code == 0, F.child_stderr(run)
    return F.store_of(run)

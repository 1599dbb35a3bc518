"""`scripts/setup.sh` is idempotent: on a machine it already set up, a second run installs nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

# Runs in the test half that starts the vLLM engines (scripts/test.sh): evens the two halves' wall time.
pytestmark = pytest.mark.engine_half

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(), reason="scripts/setup.sh has not run here")
def test_second_setup_run_installs_nothing():
    r = subprocess.run(["bash", "scripts/setup.sh"], cwd=str(REPO), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing to install" in r.stdout, r.stdout
    assert "installing the Python environment" not in r.stdout
    assert "SmolLM2 ready" in r.stdout


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(), reason="scripts/setup.sh has not run here")
def test_failed_smollm2_conversion_fails_setup_with_its_log(tmp_path):
    # A cache folder that cannot be created (its parent is a regular file): the conversion fails, and
    # set-up must say so with the conversion's own last lines instead of going on without the model.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = {**os.environ, "EAGLE_BATCH_CACHE": str(blocker / "cache"), "TMPDIR": str(tmp_path)}
    r = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=str(REPO), capture_output=True, text=True, timeout=600, env=env
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "SmolLM2 ready" not in r.stdout
    assert "converting the shipped SmolLM2 model failed" in r.stderr, r.stderr
    log = tmp_path / "eagle-batch-smollm2-setup.log"
    tail = log.read_text().strip().splitlines()[-1]
    assert tail in r.stderr, (tail, r.stderr)  # the log's last line is shown, not just its path

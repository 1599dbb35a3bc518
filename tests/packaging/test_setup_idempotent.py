"""`scripts/setup.sh` is idempotent: on a machine it already set up, a second run installs nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(), reason="scripts/setup.sh has not run here")
def test_second_setup_run_installs_nothing():
    r = subprocess.run(["bash", "scripts/setup.sh"], cwd=str(REPO), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing to install" in r.stdout, r.stdout
    assert "installing the Python environment" not in r.stdout
    assert "SmolLM2 ready" in r.stdout

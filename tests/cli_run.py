"""`eagle-batch ARGV` in a subprocess, as a user runs it: for tests of what a command prints and exits with
(a traceback, an exit code, the one line an input error gets). tests/ is on sys.path (pytest's rootdir
conftest), so a test imports it as `from cli_run import run_cli`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_cli(*argv, env: dict | None = None, cwd: Path = REPO, timeout: float = 600) -> subprocess.CompletedProcess:
    """The command's result; env adds to this process's environment (PYTHONPATH is the checkout)."""
    full = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "eagle_batch.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
        cwd=str(cwd),
    )

"""scripts/check_structure.py: passes on this tree, and fails on a copy of the package with one import that
breaks a rule (train importing capture, a store module importing launch, an environment read outside
eagle_batch/environment.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_structure.py"


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)


def test_the_tree_passes():
    r = _check(ROOT)
    assert r.returncode == 0, r.stdout
    assert r.stdout.startswith("structure ok")


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        (
            "train/loss.py",
            "from eagle_batch.capture import vllm_compat",
            "layer: eagle_batch.train.loss (layer 4) imports eagle_batch.capture.vllm_compat (a sibling of its layer",
        ),
        (
            "train/model.py",
            "def f():\n    from eagle_batch.data.template import prompt_ids",
            "layer: eagle_batch.train.model (layer 4) imports eagle_batch.data.template",
        ),
        (
            "store/reader.py",
            "import eagle_batch.launch.state",
            "layer: eagle_batch.store.reader (layer 3) imports eagle_batch.launch.state (a higher layer",
        ),
        (
            "train/fit.py",
            "import os\nLEVEL = os.environ.get('X')",
            "eagle_batch/train/fit.py:",
        ),
    ],
)
def test_a_copy_with_one_bad_import_fails(tmp_path, module, line, expected):
    shutil.copytree(ROOT / "eagle_batch", tmp_path / "eagle_batch", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "eagle_batch" / module
    path.write_text(path.read_text() + "\n" + line + "\n")
    r = _check(tmp_path)
    assert r.returncode == 1
    assert expected in r.stdout, r.stdout
    assert len(r.stdout.strip().splitlines()) == 1, r.stdout  # that import, nothing else

"""The wheel holds what an installed eagle-batch needs: the shipped configs and the demo data.

Built from a clean copy of the sources and installed (without dependencies: those come from this test
environment through a path entry) into a fresh virtual environment; then, from a folder that is not the
repository, `eagle-batch demo --help` runs and the README's config names load from the installed package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_ships_configs_and_demo_data_and_they_load_when_installed(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(REPO / "eagle_batch", src / "eagle_batch", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp_path / "dist").glob("eagle_batch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(REPO).as_posix() for p in (REPO / "eagle_batch" / "configs").rglob("*") if p.is_file()}
    assert shipped and shipped <= names, sorted(shipped - names)
    assert {
        "eagle_batch/configs/demo.yaml",
        "eagle_batch/configs/models/kimi-k2.5.yaml",
        "eagle_batch/configs/data/demo-chat.jsonl",
        "eagle_batch/demo_data/chat.jsonl",
    } <= names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # the dependencies only
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    where = tmp_path / "elsewhere"
    where.mkdir()
    r = subprocess.run(
        [str(py), "-c", "import eagle_batch, sys; print(eagle_batch.__file__)"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.startswith(str(site)), r.stdout + r.stderr
    r = subprocess.run(
        [str(py), "-m", "eagle_batch.cli", "demo", "--help"], cwd=where, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "--baseline" in r.stdout, r.stderr
    load = (
        "from eagle_batch.config import load_config; "
        "c = load_config(['configs/models/kimi-k2.5.yaml', 'configs/clusters/blackwell-8gpu.yaml'], "
        "['run_dir=/tmp/x', 'model.path=/tmp']); print(c.model.layer_ids, c.slurm.gpus_per_node); "
        "d = load_config('configs/demo.yaml'); print(d.train.name)"
    )
    r = subprocess.run([str(py), "-c", load], cwd=where, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[2, 30, 58, 61] 8", "demo-draft"]

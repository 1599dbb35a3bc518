"""RUN/report.html: three plots with data (throughput per task, lengths, loss), the summary, what each number
means, acceptance per position next to the untrained floor, and links to every output."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from eagle_batch import report
from eagle_batch.config import StoreConfig
from eagle_batch.launch import state as S
from eagle_batch.store import StoreSpec, TaskStoreWriter, aggregate


def test_report_plots_every_tasks_throughput_history(tmp_path, monkeypatch):
    run = tmp_path / "run"
    spec = StoreSpec(layer_ids=[1, 2], hidden_size=8, model_name="synthetic")
    rng = np.random.default_rng(0)
    for t in range(2):
        with TaskStoreWriter.open(S.store_path(run, t), spec, StoreConfig(fsync=False)) as w:
            for i in range(5):
                n = int(rng.integers(3, 40))
                w.append(
                    f"t{t}-{i}",
                    np.arange(n, dtype=np.int32),
                    np.ones(n, np.uint8),
                    rng.integers(0, 2**15, (n, 2, 8)).astype(np.uint16),
                )
            w.finalize()
        # what ArrayTask records at its commits: (time, tokens committed), the attempt's start first
        S.write_state(
            run, S.TaskState(task_id=t, status=S.DONE, extra={"history": [[100.0, 0], [101.0, 50], [103.5, 90]]})
        )
    aggregate(run)
    train = run / "train" / "d"
    train.mkdir(parents=True)
    train.joinpath("metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 9.0 - s}) + "\n" for s in (1, 2, 3))
    )
    figs = []
    real_png = report._png
    monkeypatch.setattr(report, "_png", lambda fig: figs.append(fig) or real_png(fig))
    out = report.write_report(run, {"tasks": 2, "acceptance_length": 1.2}, train)
    html = out.read_text()
    assert html.count("<img src='data:image/png;base64,") == 3 and "acceptance_length" in html
    throughput, lengths, loss = (f.axes[0] for f in figs)
    assert [list(line.get_ydata()) for line in throughput.lines] == [[50.0, 16.0]] * 2  # tok/s per interval
    assert throughput.get_legend() is not None
    assert sum(p.get_height() for p in lengths.patches) == 10  # every sample in the histogram
    assert list(loss.lines[0].get_ydata()) == [8.0, 7.0, 6.0]


def _small_run(tmp_path):
    run = tmp_path / "run"
    spec = StoreSpec(layer_ids=[1, 2], hidden_size=8, model_name="synthetic")
    for t in range(2):
        with TaskStoreWriter.open(S.store_path(run, t), spec, StoreConfig(fsync=False)) as w:
            for i in range(3):
                w.append(
                    f"t{t}-{i}",
                    np.arange(9, dtype=np.int32),
                    np.ones(9, np.uint8),
                    np.full((9, 2, 8), 0x3F80, np.uint16),
                )
            w.finalize()
        S.write_state(run, S.TaskState(task_id=t, status=S.DONE, extra={"history": [[0.0, 0], [1.0, 27]]}))
    aggregate(run)
    (run / "config.yaml").write_text(f"run_dir: {run}\nmodel:\n  path: /models/m\n  name: tiny-target\n")
    train = run / "train" / "d"
    (train / "export").mkdir(parents=True)
    (train / "export" / "config.json").write_text("{}")
    train.joinpath("metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    return run, train


def test_report_explains_itself_and_links_every_output(tmp_path):
    run, train = _small_run(tmp_path)
    evaluation = {
        "num_drafts": 200,
        "accepted_per_position": [120, 60, 20],
        "mean_acceptance_length": 2.0,
        "identical_outputs": True,
        "mismatches": [],
    }
    baseline = {
        "num_drafts": 400,
        "accepted_per_position": [8, 0, 0],
        "mean_acceptance_length": 1.02,
        "identical_outputs": True,
        "mismatches": [],
    }
    out = report.write_report(
        run,
        {"tasks": 2, "bytes_per_token": 30.5, "acceptance_length": 2.0, "untrained_acceptance_length": 1.02},
        train,
        evaluation,
        baseline,
    )
    page = out.read_text()
    assert "<h2>What ran</h2>" in page and "tiny-target" in page
    assert "bytes on disk per token" in page and "the floor the training must beat" in page
    # acceptance per position: 120/200, 60/200, 20/200 for the trained draft; 8/400 for the untrained one
    assert "<td>0.600</td><td>0.300</td><td>0.100</td>" in page and "<td>0.020</td><td>0.000</td>" in page
    for caption in (
        "the first interval includes the engine",
        "Samples at the right edge were truncated",
        "It should fall and flatten",
    ):
        assert caption in page
    hrefs = re.findall(r"<a href='([^']+)'", page)
    for must in (
        "config.yaml",
        "dataset.json",
        "stores/task-00000.zarr",
        "stores/task-00001.zarr",
        "train/d/metrics.jsonl",
        "train/d/export",
    ):
        assert must in hrefs, hrefs
    assert all((run / h).exists() for h in hrefs)  # relative to the run directory, and real


@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="headless Chromium is not installed (setup.sh --with-slurm installs it as root)",
)
def test_report_renders_in_a_real_browser(tmp_path):
    """Headless Chromium opens the page: its DOM holds every section and the screenshot is not blank."""
    run, train = _small_run(tmp_path)
    out = report.write_report(run, {"tasks": 2, "acceptance_length": 1.5}, train)
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(base + ["--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for h in ("What ran", "Numbers", "Capture throughput per task", "Sample lengths", "Draft training loss", "Outputs"):
        assert f"<h2>{h}</h2>" in dom.stdout
    shot = tmp_path / "report.png"
    r = subprocess.run(
        base + [f"--screenshot={shot}", "--window-size=1000,1800", "--hide-scrollbars", out.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    assert img.shape[:2] == (1800, 1000)
    assert (img[..., :3] < 0.5).mean() > 0.01  # text, tables and plots drawn, not an empty white page

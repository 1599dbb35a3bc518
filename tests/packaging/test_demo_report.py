"""The demo's report.html: three plots with data (throughput per task, lengths, loss) and the summary."""

from __future__ import annotations

import json

import numpy as np

from eagle_batch import demo
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
                w.append(f"t{t}-{i}", np.arange(n, dtype=np.int32), np.ones(n, np.uint8),
                         rng.integers(0, 2**15, (n, 2, 8)).astype(np.uint16))
            w.finalize()
        # what ExtractTask records at its commits: (time, tokens committed), the attempt's start first
        S.write_state(run, S.TaskState(task_id=t, status=S.DONE, extra={"history": [[100.0, 0], [101.0, 50], [103.5, 90]]}))
    aggregate(run)
    train = run / "train" / "d"
    train.mkdir(parents=True)
    train.joinpath("metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 9.0 - s}) + "\n" for s in (1, 2, 3)))
    figs = []
    real_png = demo._png
    monkeypatch.setattr(demo, "_png", lambda fig: figs.append(fig) or real_png(fig))
    out = demo.write_report(run, {"tasks": 2, "acceptance_length": 1.2}, train)
    html = out.read_text()
    assert html.count("<img src='data:image/png;base64,") == 3 and "acceptance_length" in html
    throughput, lengths, loss = (f.axes[0] for f in figs)
    assert [list(line.get_ydata()) for line in throughput.lines] == [[50.0, 16.0]] * 2  # tok/s per interval
    assert throughput.get_legend() is not None
    assert sum(p.get_height() for p in lengths.patches) == 10  # every sample in the histogram
    assert list(loss.lines[0].get_ydata()) == [8.0, 7.0, 6.0]

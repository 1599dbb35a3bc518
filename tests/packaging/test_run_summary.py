"""The run summary (demo-summary.json, the demo's last lines, report.html's Numbers): every key has a unit
and an explanation, the training's step time and throughput come from metrics.jsonl, the training log names
its acceptance figure for what it is, and the serving step announces each engine."""

from __future__ import annotations

import ast
import inspect
import io
import json
import re
from pathlib import Path

from eagle_batch import demo, report
from eagle_batch.train.progress import TrainProgress


def _summary_keys() -> set[str]:
    tree = ast.parse(inspect.getsource(demo._summary))
    keys = {n.value for d in ast.walk(tree) if isinstance(d, ast.Dict) for n in d.keys if isinstance(n, ast.Constant)}
    keys |= {
        n.slice.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)
    }
    keys -= {"totals", "tokens_committed", "samples_committed", "rows_kept", "mean_acceptance_length"}  # read
    return keys | {"train_step_s", "training_tokens_per_s", "train_time_acceptance_length"}  # training_figures


def test_every_summary_key_has_a_unit_and_an_explanation():
    keys = _summary_keys()
    assert {"capture_tokens_per_s", "acceptance_length", "train_step_s"} <= keys
    missing = keys - set(report.SUMMARY_FIELDS)
    assert not missing, missing
    assert all(len(text) > 20 for _, text in report.SUMMARY_FIELDS.values())


def test_training_figures_from_metrics(tmp_path):
    recs = [
        {"step": 1, "loss": 3.0, "tokens_per_s": 100.0, "step_s": 2.0, "steps_in_window": 1},
        {
            "step": 3,
            "loss": 2.0,
            "tokens_per_s": 400.0,
            "step_s": 0.5,
            "steps_in_window": 2,
            "expected_acceptance_length": 2.5,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    # 3 steps in 3 s; 200 + 400 tokens
    assert report.training_figures(tmp_path) == {
        "train_step_s": 1.0,
        "training_tokens_per_s": 200.0,
        "train_time_acceptance_length": 2.5,
    }
    assert report.training_figures(tmp_path / "none") == {}


def test_summary_lines_are_aligned_with_units():
    text = demo.summary_text({"tokens": 1200, "train_step_s": 0.25, "executor": "local"}, Path("/r/report.html"))
    lines = text.splitlines()
    assert lines[0].split() == ["tokens", "1200", "tokens"] and lines[1].split() == ["train_step_s", "0.25", "s"]
    assert len({line.index(line.split()[1]) for line in lines}) == 1  # the values start in one column


def test_training_log_names_its_acceptance_and_its_rate():
    out = io.StringIO()
    p = TrainProgress(10, 0, enabled=True, stream=out)
    p.log({"step": 1, "loss": 2.0, "acc_per_step": [0.5], "tokens_per_s": 1000.0, "expected_acceptance_length": 2.88})
    line = out.getvalue()
    assert "train-time accept 2.88" in line and "training tok/s" in line and "accept ~" not in line


def test_the_serving_check_announces_each_engine(monkeypatch):
    from eagle_batch.evaluate import serve_check

    def fake_engine(spec, timeout_s, env=None):
        return {"outputs": [[1, 2]], "top": [[[1, 0.0]], [[2, 0.0]]], "metrics": {}, "elapsed_s": 1.0}

    monkeypatch.setattr(serve_check, "_run_engine", fake_engine)
    monkeypatch.setattr(serve_check, "render_prompts", lambda target, prompts: [[1]] * len(prompts))
    monkeypatch.setattr(serve_check, "servable_target", lambda p: p)
    said: list[str] = []
    serve_check.measure_acceptance("/t", "/d", ["a"], dtype="float32", say=said.append)
    starts = [s for s in said if "starting a vLLM engine" in s]
    ends = [s for s in said if "done in" in s]
    assert len(starts) == len(ends) == 2, said


def test_the_report_explains_each_row_and_shows_the_step_time(tmp_path):
    import numpy as np

    from eagle_batch.config import StoreConfig
    from eagle_batch.launch import state as S
    from eagle_batch.store import StoreSpec, TaskStoreWriter, aggregate

    run = tmp_path / "run"
    spec = StoreSpec(layer_ids=[1, 2], hidden_size=8, model_name="synthetic")
    with TaskStoreWriter.open(S.store_path(run, 0), spec, StoreConfig(fsync=False)) as w:
        w.append("s0", np.arange(9, dtype=np.int32), np.ones(9, np.uint8), np.full((9, 2, 8), 0x3F80, np.uint16))
        w.finalize()
    S.write_state(run, S.TaskState(task_id=0, status=S.DONE, extra={"history": [[0.0, 0], [1.0, 9]]}))
    aggregate(run)
    train = run / "train" / "d"
    train.mkdir(parents=True)
    train.joinpath("metrics.jsonl").write_text(
        json.dumps({"step": 1, "loss": 3.0, "tokens_per_s": 50.0, "step_s": 0.75, "steps_in_window": 1}) + "\n"
    )
    summary = {k: 1 for k in report.SUMMARY_FIELDS} | report.training_figures(train)
    html = report.write_report(run, summary, train).read_text()
    rows = re.findall(r"<tr><td>(\w+)</td><td[^>]*>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td></tr>", html)
    assert {r[0] for r in rows} == set(report.SUMMARY_FIELDS)
    assert all(r[3] for r in rows)  # every row says what it means
    assert ("train_step_s", "0.75", "s") in {r[:3] for r in rows}

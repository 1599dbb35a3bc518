"""Checks that stop a run before it wastes an engine start, and commands that refuse to succeed on nothing.

- `data.max_length` must stay below `model.max_model_len` (vLLM needs the prompt plus the one token it
  generates): refused by the config check, by `prepare`, and by `extract` for prepared data that no
  longer fits (the config changed since prepare);
- `aggregate`, `verify`, `train` and `validate` on a run whose stores hold no sample say so and fail,
  without a traceback.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli_run import run_cli as cli

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "configs" / "data" / "demo-chat.jsonl"


def no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]


def test_max_length_must_leave_room_for_the_generated_token():
    from eagle_batch.config import ConfigError, check_values
    from eagle_batch.config.schema import RunConfig

    cfg = RunConfig(run_dir="/tmp/x")
    cfg.model.path = "/tmp"
    cfg.model.max_model_len, cfg.data.max_length = 2048, 2048
    with pytest.raises(
        ConfigError,
        match=r"data.max_length=2048 must be below model.max_model_len=2048.*"
        r"Set data.max_length=2047 or model.max_model_len=2049",
    ):
        check_values(cfg)
    cfg.data.max_length = 2047
    check_values(cfg)
    cfg.model.tensor_parallel_size, cfg.slurm.gpus_per_node = 8, 1
    with pytest.raises(
        ConfigError,
        match=r"model.tensor_parallel_size=8 needs 8 GPUs per task but "
        r"slurm.gpus_per_node=1",
    ):
        check_values(cfg)


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama")


def _config(tmp_path: Path, model: Path, **data) -> Path:
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(model), "max_model_len": 512, "dtype": "float32"},
        "data": {"inputs": [str(DATA)], "format": "messages", "max_length": 256, **data},
        "extract": {"num_tasks": 2, "backend": "hf"},
        "slurm": {"executor": "local", "gpus_per_node": 0},
    }
    p = tmp_path / "run.yaml"
    p.write_text(json.dumps(cfg))
    return p


def test_prepare_refuses_max_length_that_does_not_fit_the_engine(tmp_path, model):
    r = cli("prepare", _config(tmp_path, model, max_length=512), "--no-progress")
    assert r.returncode == 2
    assert "data.max_length=512 must be below model.max_model_len=512" in r.stderr
    no_traceback(r)
    assert not (tmp_path / "run" / "prepared").exists()


def test_prepare_refuses_layer_ids_outside_the_model(tmp_path, model):
    r = cli("prepare", _config(tmp_path, model), "model.layer_ids=[2,9]", "--no-progress")
    assert r.returncode == 2
    assert "model.layer_ids=[2, 9]: ids [9] are outside 0..6" in r.stderr
    no_traceback(r)


def test_extract_refuses_prepared_samples_longer_than_the_engine_takes(tmp_path, model):
    cfg = _config(tmp_path, model)
    assert cli("prepare", cfg, "--no-progress", "--workers", "1").returncode == 0
    longest = json.loads((tmp_path / "run" / "prepared" / "summary.json").read_text())["length_percentiles"]["max"]
    r = cli("extract", cfg, f"model.max_model_len={longest}", "data.max_length=50", "--force")
    assert r.returncode == 2, r.stderr
    assert (
        f"holds samples of up to {longest} tokens, but model.max_model_len={longest} allows at most "
        f"{longest - 1}" in r.stderr
    )
    no_traceback(r)
    assert not (tmp_path / "run" / "slurm").exists()  # nothing submitted


def test_commands_on_a_run_without_samples_fail_and_say_why(tmp_path, model):
    run = tmp_path / "run"
    (run / "prepared").mkdir(parents=True)
    (run / "prepared" / "plan.json").write_text(
        json.dumps(
            {"num_tasks": 2, "tasks": [{"task_id": t, "rows": [], "num_tokens": 0, "num_samples": 0} for t in range(2)]}
        )
    )
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "run_dir": str(run),
                "model": {"path": str(model)},
                "extract": {"work": "tests.slurm.work:empty_work"},
                "slurm": {"executor": "local", "gpus_per_node": 0},
                "train": {"steps": 2, "num_workers": 0, "tensorboard": False},
            }
        )
    )
    assert cli("extract", cfg, "--wait", "--interval", "0.5").returncode == 0

    expected = {
        ("verify", run): "the 2 store(s) hold no committed samples",
        ("aggregate", run): "hold no samples: nothing was extracted",
        ("train", cfg, "--local"): "holds no committed samples (its 2 task store(s) are empty",
        ("validate", run, "--samples", "2"): "hold no committed samples: nothing to validate",
    }
    for argv, message in expected.items():
        r = cli(*argv)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert message in r.stderr, (argv, r.stderr)
        assert "OK" not in r.stdout
        no_traceback(r)

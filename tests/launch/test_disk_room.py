"""The disk check before an extraction is submitted (launch/disk_room.py): the states left to capture against
the free space under RUN/stores, raw and at the best compression measured (store/footprint.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.launch.test_run_checks import _config, cli, no_traceback


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama")


def test_raw_bytes_per_token_count_every_token_array():
    from eagle_batch.store.footprint import least_bytes_per_token, raw_bytes_per_token

    # bf16: 4 layers x 576 x 2 bytes, the int32 token id, the loss-mask byte
    assert raw_bytes_per_token(4, 576, "bfloat16") == 4 * 576 * 2 + 4 + 1
    # float8: one byte per element plus a float32 scale per layer
    assert raw_bytes_per_token(4, 7168, "float8_e5m2") == 4 * 7168 + 4 * 4 + 4 + 1
    assert least_bytes_per_token(4, 576, "bfloat16", "none") == raw_bytes_per_token(4, 576, "bfloat16")
    assert least_bytes_per_token(4, 576, "bfloat16", "blosc-zstd") < raw_bytes_per_token(4, 576, "bfloat16")


def _cfg(tmp_path: Path, dtype: str = "bfloat16"):
    from eagle_batch.config.schema import RunConfig

    cfg = RunConfig(run_dir=str(tmp_path / "run"))
    cfg.store.dtype = dtype
    return cfg


def test_error_warning_or_nothing_by_the_free_space(tmp_path):
    from eagle_batch.config import ConfigError
    from eagle_batch.launch.disk_room import check_disk_room
    from eagle_batch.store.footprint import least_bytes_per_token, raw_bytes_per_token

    cfg, tokens = _cfg(tmp_path), 1_000_000
    raw = tokens * raw_bytes_per_token(4, 576, "bfloat16")
    least = tokens * least_bytes_per_token(4, 576, "bfloat16", "blosc-zstd")
    assert check_disk_room(cfg, 4, 576, tokens, free=raw + 1) is None
    warning = check_disk_room(cfg, 4, 576, tokens, free=(raw + least) // 2)
    assert warning.startswith("warning: ") and "eagle-batch resume" in warning and "4.6 GB raw" in warning
    with pytest.raises(ConfigError) as e:
        check_disk_room(cfg, 4, 576, tokens, free=int(least) - 1)
    msg = str(e.value)
    assert str(tmp_path / "run" / "stores") in msg and "Nothing was submitted" in msg
    assert "store.dtype=float8_e5m2" in msg and "extract.check_disk=false" in msg
    # float8 states need about half the bytes: the same tokens then fit where bf16 does not
    cfg8 = _cfg(tmp_path, "float8_e5m2")
    assert check_disk_room(cfg8, 4, 576, tokens, free=int(least) - 1) is None


def _doctored_run(tmp_path: Path, model: Path, tokens_per_task: int) -> Path:
    """A prepared run whose plan says its tasks hold `tokens_per_task` tokens each (a corpus far larger than
    the demo chats, without preparing one)."""
    cfg = _config(tmp_path, model)
    assert cli("prepare", cfg, "--no-progress", "--workers", "1").returncode == 0
    plan_file = tmp_path / "run" / "prepared" / "plan.json"
    plan = json.loads(plan_file.read_text())
    for task in plan["tasks"]:
        task["num_tokens"] = tokens_per_task
    plan_file.write_text(json.dumps(plan))
    return cfg


def test_extract_refuses_a_run_that_cannot_fit_the_disk_before_submitting(tmp_path, model):
    free = shutil.disk_usage(tmp_path).free
    cfg = _doctored_run(tmp_path, model, tokens_per_task=free)  # >= 1 byte per token per task: never fits
    r = cli("extract", cfg)
    assert r.returncode == 2, r.stderr
    assert f"{2 * free:,} tokens of hidden states" in r.stderr and "GB free" in r.stderr
    assert "extract.check_disk=false submits anyway" in r.stderr
    no_traceback(r)
    assert not (tmp_path / "run" / "slurm").exists()  # nothing submitted


def test_committed_tokens_are_not_counted_and_resume_only_warns(tmp_path, model):
    from eagle_batch.config import load_config
    from eagle_batch.data import PreparedDataset
    from eagle_batch.launch.disk_room import capture_room, tokens_left
    from eagle_batch.launch.state import TaskState, write_state

    free = shutil.disk_usage(tmp_path).free
    cfg_file = _doctored_run(tmp_path, model, tokens_per_task=free)
    cfg = load_config([str(cfg_file)])
    write_state(cfg.run_dir, TaskState(task_id=0, status="done", tokens_total=free, tokens_committed=free))
    write_state(cfg.run_dir, TaskState(task_id=1, tokens_total=free, tokens_committed=free - 1000))
    assert tokens_left(cfg.run_dir, PreparedDataset(cfg.run_dir), [1]) == 1000
    assert capture_room(cfg, [1]) is None  # 1000 tokens fit
    write_state(cfg.run_dir, TaskState(task_id=1, tokens_total=free, tokens_committed=0))
    said = capture_room(cfg, [1], strict=False)  # resume: said, not refused
    assert said.startswith("warning: ") and "at least" in said and "eagle-batch resume" in said
    assert "Nothing was submitted" not in said and "extract.check_disk" not in said  # resume takes no extract.*
    cfg.extract.check_disk = False
    assert capture_room(cfg, [1]) is None

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
    from eagle_batch.launch.disk_room import NoRoomError, check_disk_room
    from eagle_batch.store.footprint import least_bytes_per_token, raw_bytes_per_token

    cfg, tokens = _cfg(tmp_path), 1_000_000
    raw = tokens * raw_bytes_per_token(4, 576, "bfloat16")
    least = tokens * least_bytes_per_token(4, 576, "bfloat16", "blosc-zstd")
    assert check_disk_room(cfg, 4, 576, tokens, free=raw + 1) is None
    warning = check_disk_room(cfg, 4, 576, tokens, free=(raw + least) // 2)
    assert warning.startswith("warning: ") and "eagle-batch resume" in warning and "4.61 GB raw" in warning
    with pytest.raises(NoRoomError) as e:
        check_disk_room(cfg, 4, 576, tokens, free=int(least) - 1)
    msg = str(e.value)
    assert str(tmp_path / "run" / "stores") in msg and "Nothing was submitted" in msg
    assert "store.dtype=float8_e5m2" in msg and "adding extract.check_disk=false to this command" in msg
    # small figures in small units: never "0.0 GB"
    with pytest.raises(NoRoomError) as e:
        check_disk_room(cfg, 4, 576, 300, free=2_000)
    assert "1.38 MB raw" in str(e.value) and "has 2.00 kB free" in str(e.value)
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
    assert "adding extract.check_disk=false to this command submits anyway" in r.stderr
    no_traceback(r)
    assert not (tmp_path / "run" / "slurm").exists()  # nothing submitted


def test_committed_tokens_are_not_counted_and_resume_refuses_too(tmp_path, model):
    from eagle_batch.config import load_config
    from eagle_batch.data import PreparedDataset
    from eagle_batch.launch.disk_room import NoRoomError, capture_room, tokens_left
    from eagle_batch.launch.state import TaskState, write_state

    free = shutil.disk_usage(tmp_path).free
    cfg_file = _doctored_run(tmp_path, model, tokens_per_task=free)
    cfg = load_config([str(cfg_file)])
    write_state(cfg.run_dir, TaskState(task_id=0, status="done", tokens_total=free, tokens_committed=free))
    write_state(cfg.run_dir, TaskState(task_id=1, tokens_total=free, tokens_committed=free - 1000))
    assert tokens_left(cfg.run_dir, PreparedDataset(cfg.run_dir), [1]) == 1000
    assert capture_room(cfg, [1]) is None  # 1000 tokens fit
    write_state(cfg.run_dir, TaskState(task_id=1, tokens_total=free, tokens_committed=0))
    with pytest.raises(NoRoomError) as e:  # resume: refused too, with resume's own command lines
        capture_room(cfg, [1], resume=True)
    said = str(e.value)
    assert "at least" in said and "Nothing was submitted" in said and "Free at least" in said
    assert f"`eagle-batch resume {cfg.run_dir} extract.check_disk=false` submits anyway" in said
    cfg.extract.check_disk = False
    assert capture_room(cfg, [1]) is None


def test_check_disk_is_the_command_s_not_the_run_s(tmp_path):
    """extract.check_disk=false (the disk check's own advice) leaves the run's fingerprint alone and is not
    saved in RUN/config.yaml: the same run goes on, and a later resume checks the disk again."""
    from eagle_batch.config import config_hash, load_run_config, save_config
    from eagle_batch.config.validate import plan_differences

    cfg, off = _cfg(tmp_path), _cfg(tmp_path)
    cfg.model.path = off.model.path = str(tmp_path)
    off.extract.check_disk = False
    assert config_hash(off) == config_hash(cfg) and plan_differences(cfg, off, ("extract",)) == ""
    save_config(off, cfg.run_dir)
    assert load_run_config(cfg.run_dir).extract.check_disk is True
    assert off.extract.check_disk is False  # the caller's config is left as it was

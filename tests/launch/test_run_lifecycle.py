"""A finished run changed by hand, then `status`, `resume`, `aggregate` and `train`'s reader on it.

- a task store deleted by hand: `status` shows its task `lost` (not `done`), `resume` extracts it again, and
  a RUN/dataset.json that still lists it says so, with what to run;
- `resume --repair` of a store damaged after the run finished on the local executor resubmits its task (the
  finished task belongs to the latest local submission: it was reported `done` and nothing was resubmitted);
- a RUN/config.yaml whose model or data settings were edited since a task started: `resume` refuses before
  submitting (every attempt of the task would fail on the store's spec).

Synthetic work (tests/slurm/work.py) on the local executor: the real task, state files and stores, no model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.launch.test_local_executor import cli, make_run, no_traceback, status  # noqa: E402
from tests.slurm import work  # noqa: E402


@pytest.fixture
def finished(tmp_path) -> tuple[Path, Path]:
    run, cfg = make_run(tmp_path, 2, gpus_per_node=0)
    r = cli("extract", cfg, "--wait", "--interval", "0.5", env={})
    assert r.returncode == 0, r.stderr + r.stdout
    assert cli("aggregate", run, "--no-progress", env={}).returncode == 0
    return run, cfg


def _states(run: Path) -> dict[int, dict]:
    return {r["task_id"]: r for r in status(run, {})["tasks"]}


def test_a_deleted_task_store_is_lost_and_resume_extracts_it_again(finished):
    import shutil

    from eagle_batch.store import StoreError, open_dataset

    run, _ = finished
    shutil.rmtree(run / "stores" / "task-00001.zarr")
    with pytest.raises(StoreError, match=r"dataset.json lists stores/task-00001.zarr, which no longer exists"):
        open_dataset(run)
    rows = _states(run)
    assert rows[0]["state"] == "done" and rows[1]["state"] == "lost", rows
    assert "task-00001.zarr no longer exists" in rows[1]["last_error"]

    r = cli("resume", run, "--wait", "--interval", "0.5", env={})
    assert r.returncode == 0, r.stderr + r.stdout
    assert "resubmitting 1 task(s): 1" in r.stdout
    assert _states(run)[1]["state"] == "done"
    assert cli("aggregate", run, "--no-progress", env={}).returncode == 0
    assert len(open_dataset(run)) == 2 * work.N_SAMPLES


def test_resume_repair_resubmits_a_finished_local_task_whose_store_was_damaged(finished):
    run, _ = finished
    shard = next((run / "stores" / "task-00000.zarr" / "hidden_states" / "c").rglob("*"))
    while shard.is_dir():
        shard = next(shard.iterdir())
    shard.write_bytes(shard.read_bytes()[:-10])
    r = cli("resume", run, "--repair", "--wait", "--interval", "0.5", env={})
    assert r.returncode == 0, r.stderr + r.stdout
    assert "resubmitting 1 task(s): 0" in r.stdout, r.stdout
    # The repair committed a new record: the aggregate view made before it is stale until aggregated again.
    stale = cli("verify", run, "--no-progress", env={})
    assert stale.returncode == 1 and "stale" in stale.stdout + stale.stderr
    assert cli("aggregate", run, "--no-progress", env={}).returncode == 0
    assert cli("verify", run, "--no-progress", env={}).returncode == 0


def test_resume_refuses_a_config_edited_since_the_task_started(tmp_path, tiny_model):
    """A capture run whose task 0 stopped part-way (a store with one committed sample), then config.yaml edited."""
    import numpy as np

    from eagle_batch.config import load_run_config, save_config
    from eagle_batch.config.schema import RunConfig
    from eagle_batch.launch.store_match import store_spec
    from eagle_batch.store import TaskStoreWriter

    run = tmp_path / "run"
    (run / "prepared").mkdir(parents=True)
    plan = {"num_tasks": 1, "tasks": [{"task_id": 0, "rows": [0, 1], "num_samples": 2, "num_tokens": 20}]}
    (run / "prepared" / "plan.json").write_text(json.dumps(plan))
    cfg = RunConfig(run_dir=str(run))
    cfg.model.path = str(tiny_model("llama"))
    cfg.slurm.executor, cfg.slurm.gpus_per_node = "local", 0
    save_config(cfg, run)
    spec = store_spec(load_run_config(run))
    w = TaskStoreWriter.open(run / "stores" / "task-00000.zarr", spec, cfg.store)
    n, layers, hidden = 10, len(spec.layer_ids), spec.hidden_size
    w.append("s0", np.arange(n, dtype=np.int32), np.ones(n, np.uint8), np.zeros((n, layers, hidden), np.uint16))
    w.commit()
    w.close()

    conf = run / "config.yaml"
    conf.write_text(conf.read_text().replace("  layer_ids: null", "  layer_ids: [2, 6]", 1))
    r = cli("resume", run, env={})
    assert r.returncode == 2, r.stderr + r.stdout
    assert "task-00000.zarr was written with another model or config than" in r.stderr
    assert "layer_ids: store has [2, 3, 6], config.yaml gives [2, 6]" in r.stderr
    assert "Nothing was submitted" in r.stderr
    no_traceback(r)
    assert not (run / "slurm").exists()


def test_extract_again_redoes_a_task_whose_store_was_deleted(finished):
    import shutil

    from eagle_batch.store import open_dataset

    run, cfg = finished
    shutil.rmtree(run / "stores" / "task-00000.zarr")
    r = cli("extract", cfg, "--wait", "--interval", "0.5", env={})
    assert r.returncode == 0, r.stderr + r.stdout
    assert "task(s) 0 finished, but their stores are gone" in r.stdout, r.stdout
    assert "nothing to submit" not in r.stdout
    assert _states(run)[0]["state"] == "done"
    assert cli("aggregate", run, "--no-progress", env={}).returncode == 0
    assert len(open_dataset(run)) == 2 * work.N_SAMPLES


def test_train_warns_that_dataset_json_leaves_out_stores_finished_since(finished):
    """An index written while a task was still running (simulated by dropping its entry): `train` says which
    complete stores it leaves out and to aggregate again; after `aggregate`, nothing."""
    run, cfg = finished
    index = json.loads((run / "dataset.json").read_text())
    index["stores"] = index["stores"][:1]
    (run / "dataset.json").write_text(json.dumps(index))
    r = cli("train", cfg, "--dry-run", env={})
    assert r.returncode == 0, r.stderr + r.stdout
    assert "does not list 1 task store(s) that finished since it was written (stores/task-00001.zarr)" in r.stderr
    assert f"eagle-batch aggregate {run}" in r.stderr
    assert cli("aggregate", run, "--no-progress", env={}).returncode == 0
    r = cli("train", cfg, "--dry-run", env={})
    assert r.returncode == 0 and "does not list" not in r.stderr, r.stderr

"""`eagle-batch regenerate` on inputs that must stop it, without an engine:

- a regenerate.run_dir holding an extraction run (planning there with --force replaced its prepared data and
  config.yaml), or run_dir itself: refused, whatever the flags;
- a regenerate.run_dir planned under other settings: the keys that differ are named, with both values;
- a finished regeneration that wrote no conversation (every answer cut at max_tokens): `--wait` exits 1 with
  the reason and the key to change, not 0 over an empty output folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import run_cli as cli

from eagle_batch.cli.regenerate import regeneration_config
from eagle_batch.launch.state import DONE, TaskState, write_state
from eagle_batch.regenerate.plan import plan_regeneration
from eagle_batch.regenerate.shards import ShardWriter

U = {"role": "user", "content": "Hi"}


@pytest.fixture
def config(tmp_path, tiny_model) -> Path:
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Q{i}?"}]}) + "\n" for i in range(3)))
    conf = tmp_path / "rg.yaml"
    conf.write_text(
        json.dumps(
            {
                "run_dir": str(tmp_path / "run"),
                "model": {"path": str(tiny_model("llama")), "max_model_len": 512},
                "data": {"inputs": [str(src)], "max_length": 256},
                "regenerate": {"max_tokens": 8},
                "slurm": {"executor": "local", "gpus_per_node": 0},
            }
        )
    )
    return conf


def _planned(conf: Path) -> Path:
    """Plan RUN/regenerate as the command does, without submitting anything."""
    from eagle_batch.config import load_config

    rcfg = regeneration_config(load_config(conf))
    plan_regeneration(rcfg)
    return Path(rcfg.run_dir)


def test_a_run_dir_of_another_kind_is_refused_even_with_force(config, tmp_path):
    extraction = tmp_path / "extraction"
    extraction.mkdir()
    (extraction / "config.yaml").write_text(json.dumps({"run_dir": str(extraction), "model": {"path": "/m"}}))
    (extraction / "prepared").mkdir()
    (extraction / "prepared" / "plan.json").write_text('{"num_tasks": 1, "tasks": []}')
    r = cli("regenerate", config, f"regenerate.run_dir={extraction}", "--force")
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        f"regenerate.run_dir={extraction} is another kind of run (its config.yaml has extract.work=capture" in r.stderr
    )
    assert json.loads((extraction / "prepared" / "plan.json").read_text())["tasks"] == []  # left as it was
    r = cli("regenerate", config, f"regenerate.run_dir={tmp_path / 'run'}")
    assert r.returncode == 2 and "is run_dir itself" in r.stderr, r.stderr


def test_a_plan_made_under_other_settings_names_the_keys_that_differ(config):
    _planned(config)
    r = cli("regenerate", config, "regenerate.max_tokens=16", "regenerate.top_p=0.5")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "regenerate.top_p: 1.0 in the run, 0.5 now" in r.stderr
    assert "regenerate.max_tokens: 8 in the run, 16 now" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_finished_regeneration_that_wrote_nothing_fails_and_says_why(config):
    run = _planned(config)
    ids = [json.loads(x)["id"] for x in (run / "prepared" / "task-00000.jsonl").read_text().splitlines()]
    failures = [{"id": i, "reason": "cut_off"} for i in ids]
    with ShardWriter(run, 0) as w:  # what the task commits when every first answer hits max_tokens
        w.commit(ids, [], failures, {"failed_cut_off": len(ids), "answers_cut_off": len(ids)})
    write_state(run, TaskState(task_id=0, status=DONE, samples_total=len(ids), samples_committed=len(ids)))
    r = cli("regenerate", config, "--wait", "--interval", "0.2")
    assert "nothing to submit" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"nothing was regenerated: all {len(ids)} conversation(s) failed (cut_off {len(ids)}" in r.stderr
    assert "raise regenerate.max_tokens, or set regenerate.keep_cut_off=true" in r.stderr


def test_resume_refuses_a_config_yaml_edited_since_the_plan(config):
    """RUN/regenerate/config.yaml edited by hand (regenerate.max_tokens) before `resume`: the conversations left
    would be answered under other settings than those done; refused, naming the key, before submitting."""
    import yaml

    run = _planned(config)
    assert (run / "prepared" / "planned.yaml").is_file()
    conf = yaml.safe_load((run / "config.yaml").read_text())
    conf["regenerate"]["max_tokens"] = 16
    (run / "config.yaml").write_text(yaml.safe_dump(conf))
    r = cli("resume", run)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "was changed since the run was planned (regenerate.max_tokens: 8 in the run, 16 now)" in r.stderr
    assert "Traceback" not in r.stderr and not (run / "slurm").exists(), r.stderr
    conf["regenerate"]["max_tokens"] = 8
    (run / "config.yaml").write_text(yaml.safe_dump(conf))
    r = cli("resume", run, "--dry-run")
    assert r.returncode == 0 and "resubmitting 1 task(s): 0" in r.stdout, r.stdout + r.stderr

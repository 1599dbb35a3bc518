"""No Python traceback reaches a user for an input-caused error, whichever command they type.

Every command runs on a set of bad inputs (missing or malformed files, a run directory that is not one, a
state file edited by hand, ...). Each must exit non-zero with a message on stderr and no traceback; where the
input is a path, the message names it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_run import run_cli as cli


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    paths = {"missing": d / "missing", "a_file": d / "a-file.txt"}
    paths["a_file"].write_text("not a run")
    paths["bad_yaml"] = d / "bad.yaml"
    paths["bad_yaml"].write_text("run_dir: [unclosed\n")
    paths["unknown_key"] = d / "unknown.yaml"
    paths["unknown_key"].write_text(json.dumps({"run_dir": str(d / "r1"), "model": {"path": str(d)}, "modle": {}}))
    paths["no_model"] = d / "no-model.yaml"
    paths["no_model"].write_text(
        json.dumps(
            {
                "run_dir": str(d / "r2"),
                "model": {"path": str(d / "nowhere")},
                "data": {"inputs": [str(d / "nowhere.jsonl")]},
            }
        )
    )
    # A run directory whose files were edited by hand.
    run = d / "edited"
    (run / "prepared").mkdir(parents=True)
    (run / "state").mkdir()
    (run / "slurm").mkdir()
    (run / "prepared" / "plan.json").write_text(
        json.dumps({"num_tasks": 1, "tasks": [{"task_id": 0, "rows": [], "num_tokens": 0, "num_samples": 0}]})
    )
    (run / "state" / "task-00000.json").write_text("{half a state")
    (run / "config.yaml").write_text(f"run_dir: {run}\nmodel:\n  path: {d}\n")
    paths["edited_state"] = run
    run2 = d / "bad-plan"
    (run2 / "prepared").mkdir(parents=True)
    (run2 / "prepared" / "plan.json").write_text("[1, 2")
    (run2 / "config.yaml").write_text(f"run_dir: {run2}\nmodel:\n  path: {d}\n")
    paths["bad_plan"] = run2
    run3 = d / "bad-submissions"
    (run3 / "prepared").mkdir(parents=True)
    (run3 / "slurm").mkdir()
    (run3 / "prepared" / "plan.json").write_text(
        json.dumps({"num_tasks": 1, "tasks": [{"task_id": 0, "rows": [], "num_tokens": 0, "num_samples": 0}]})
    )
    (run3 / "slurm" / "submissions.jsonl").write_text('{"job_id": "1", "executor"\n')
    (run3 / "config.yaml").write_text(f"run_dir: {run3}\nmodel:\n  path: {d}\n")
    paths["bad_submissions"] = run3
    # A plain model folder, a folder that looks like an exported draft, a prompts file that is not UTF-8.
    paths["plain_model"] = d / "plain-model"
    paths["plain_model"].mkdir()
    (paths["plain_model"] / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    paths["draft"] = d / "draft"
    paths["draft"].mkdir()
    (paths["draft"] / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    paths["latin1_prompts"] = d / "prompts.jsonl"
    paths["latin1_prompts"].write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    return paths


# (argv with {names} of the `bad` fixture, a text the message must contain)
CASES = [
    (["prepare", "{missing}"], "{missing}"),
    (["prepare", "{bad_yaml}"], "not valid YAML"),
    (["prepare", "{unknown_key}"], "modle"),
    (["prepare", "{no_model}"], "nowhere"),
    (["prepare", "{no_model}", "extract.num_tasks=many"], "extract.num_tasks"),
    (["regenerate", "{missing}"], "{missing}"),
    (["regenerate", "{bad_yaml}"], "not valid YAML"),
    (["regenerate", "{no_model}"], "nowhere"),
    (["regenerate", "{no_model}", "regenerate.turns=some"], "regenerate.turns"),
    (["extract", "{missing}"], "{missing}"),
    (["extract", "{no_model}"], "nowhere"),
    (["train", "{missing}", "--local"], "{missing}"),
    (["train", "{no_model}", "--local"], ""),
    (["status", "{missing}"], "{missing}"),
    (["status", "{a_file}"], "{a_file}"),
    (["status", "{edited_state}"], "task-00000.json is not a valid task state file"),
    (["status", "{bad_plan}"], "plan.json is not a plan prepare wrote"),
    (["status", "{bad_submissions}"], "submissions.jsonl:1 is not a submission record"),
    (["resume", "{missing}"], "{missing}"),
    (["resume", "{edited_state}"], "task-00000.json"),
    (["resume", "{bad_plan}"], "plan.json"),
    (["cancel", "{missing}"], "{missing}"),
    (["aggregate", "{missing}"], "{missing}"),
    (["aggregate", "{a_file}"], "{a_file}"),
    (["verify", "{missing}"], "{missing}"),
    (["verify", "{a_file}"], "{a_file}"),
    (["validate", "{missing}"], "{missing}"),
    (["validate", "{edited_state}"], "no config.json there"),
    (["evaluate", "{missing}"], "{missing}"),
    (["evaluate", "{edited_state}"], "no exported draft"),
    (["evaluate", "{edited_state}", "--draft", "{a_file}"], "{a_file}"),
    (["evaluate", "{edited_state}", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: 1.5"),
    (["evaluate", "{edited_state}", "--kv-cache-gib", "-1"], "--kv-cache-gib: -1"),
    (["evaluate", "{edited_state}", "--k", "3", "0"], "--k: 0: expected an integer >= 1"),
    (["evaluate", "{edited_state}", "--num-prompts", "-1"], "--num-prompts: -1"),
    (["evaluate", "{edited_state}", "--max-tokens", "0"], "--max-tokens: 0"),
    (["evaluate", "{edited_state}", "--draft", "{plain_model}"], "LlamaForCausalLM, not an EAGLE-3 draft"),
    (
        ["evaluate", "{edited_state}", "--draft", "{draft}", "--prompts", "{latin1_prompts}"],
        "{latin1_prompts}:2: not UTF-8",
    ),
    (["validate", "{edited_state}", "--samples", "0"], "--samples: 0"),
    (["validate", "{edited_state}", "--device", "tpu"], "--device tpu: not a torch device"),
    (["validate", "{edited_state}", "--dtype", "float8"], "--dtype: invalid choice"),
    (["bench", "store", "--level", "99"], "--level: 99: expected an integer in [0, 9]"),
    (["bench", "store", "--sample-tokens", "0"], "--sample-tokens: 0"),
    (["bench", "loader", "--workers", "1,a"], "--workers: 'a'"),
    (["bench", "slurm", "--tasks", "0"], "--tasks: 0"),
    (["prepare", "{no_model}", "--workers", "-3"], "--workers: -3"),
    # key=value after a flag is read as an override, not refused as an unrecognized argument
    (["prepare", "{no_model}", "--no-progress", "data.limit=3"], "nowhere"),
    (["export-data", "{missing}", "{missing}", "--format", "speculators"], "{missing}"),
    (["export-data", "{a_file}", "{missing}", "--format", "specforge"], "{a_file}"),
    (["export-data", "{edited_state}", "{missing}", "--format", "speculators"], "nor an aggregated run"),
    (["import-data", "{missing}", "{missing}", "--aux-layer-ids", "2", "--num-hidden-layers", "6"], "{missing}"),
    (["import-data", "{a_file}", "{missing}", "--aux-layer-ids", "2", "--num-hidden-layers", "6"], "{a_file}"),
    (["import-data", "{edited_state}", "{missing}", "--aux-layer-ids", "9", "--num-hidden-layers", "6"], "ascending"),
]
if not torch.cuda.is_available():  # on a GPU machine the option is valid
    CASES.append((["evaluate", "{edited_state}", "--batch-invariant"], "need a CUDA GPU"))


@pytest.mark.parametrize("argv,expect", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_gives_a_message_not_a_traceback(bad, argv, expect):
    fill = {k: str(v) for k, v in bad.items()}
    r = cli(*(a.format(**fill) for a in argv))
    assert r.returncode == 2, (argv, r.returncode, r.stdout)  # a usage or input mistake
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-4000:]
    assert r.stderr.strip(), "an error must say something"
    assert expect.format(**fill) in r.stderr, r.stderr

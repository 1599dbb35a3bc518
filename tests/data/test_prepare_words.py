"""What prepare says about what it could not keep whole: a few Latin-1 rows among UTF-8 ones get the conversion
hint; more tasks than samples is refused with both numbers; answers cut at data.max_length are counted in
samples and in assistant (trained) tokens, in the summary and in summary.json, naming data.max_length."""

from __future__ import annotations

import json

import pytest

from tests.data.test_bad_input import jsonl, no_traceback, prepare


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama")


def _chat(i: int, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": answer}]}


def test_a_few_latin1_rows_get_the_conversion_hint(tmp_path, model):
    path = tmp_path / "mostly-ascii.jsonl"
    rows = [json.dumps(_chat(i, "caf\u00e9 cr\u00e8me" if i == 3 else "coffee"), ensure_ascii=False) for i in range(6)]
    path.write_bytes("".join(r + "\n" for r in rows).encode("latin-1"))
    r, _ = prepare(tmp_path, model, [path])
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    said = r.stdout + r.stderr
    assert f"{path}: 1 of 6 rows are not valid UTF-8 (skipped): if the file is in another encoding (Latin-1" in said
    assert "iconv -f latin1 -t utf-8" in said


def test_more_tasks_than_samples_is_refused_with_the_numbers(tmp_path, model):
    path = jsonl(tmp_path / "six.jsonl", [_chat(i, f"Answer {i}.") for i in range(6)])
    r, _ = prepare(tmp_path, model, [path], "extract.num_tasks=9")
    no_traceback(r)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "extract.num_tasks=9: 9 tasks for 6 samples; set extract.num_tasks <= 6" in r.stderr
    assert not (tmp_path / "run" / "prepared").exists()


def test_truncation_counts_samples_and_the_assistant_tokens_it_dropped(tmp_path, model):
    long = " ".join(f"word{k}" for k in range(60))
    path = jsonl(tmp_path / "long.jsonl", [_chat(i, long if i % 2 else "Short.") for i in range(6)])
    r, _ = prepare(tmp_path, model, [path], "data.max_length=256", run="whole")
    assert r.returncode == 0, r.stderr
    whole = json.loads((tmp_path / "whole" / "prepared" / "summary.json").read_text())
    assert whole["samples_truncated"] == 0 and whole["truncated_loss_tokens"] == 0
    r, _ = prepare(tmp_path, model, [path], "data.max_length=40", run="cut")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    cut = json.loads((tmp_path / "cut" / "prepared" / "summary.json").read_text())
    assert cut["samples"] == whole["samples"] == 6 and cut["samples_truncated"] == 3
    dropped = whole["loss_tokens"] - cut["loss_tokens"]  # the same samples, less their cut tails
    assert dropped > 0 and cut["truncated_loss_tokens"] == dropped
    assert (
        f"truncated: 3 sample(s) longer than data.max_length=40 were cut, dropping {dropped:,} assistant (trained) "
        f"token(s) of {whole['loss_tokens']:,}; raise data.max_length" in r.stdout + r.stderr
    ), r.stderr

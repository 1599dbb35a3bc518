"""Chat-format variants real datasets contain: each is trained with the right mask or skipped under a named
reason (counted, listed with its file and line), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from eagle_batch.config import DataConfig, ExtractConfig, ModelConfig, RunConfig
from eagle_batch.data import PreparedDataset, prepare
from tests.data.conftest import build_family_tokenizer, masked_runs

CONV = [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi there."}]

U = {"role": "user", "content": "Weather in Paris?"}


def make_cfg(tmp_path, smollm2_path, inputs, name="run") -> RunConfig:
    return RunConfig(
        run_dir=str(tmp_path / name),
        model=ModelConfig(path=str(smollm2_path)),
        data=DataConfig(inputs=[str(p) for p in inputs]),
        extract=ExtractConfig(num_tasks=1),
    )


def run_prepare(cfg, tok):
    summary = prepare(cfg, workers=1, progress=False, tokenizer=tok)
    bad_rows = Path(cfg.run_dir) / "prepared" / "bad_rows.jsonl"
    return summary, [json.loads(x) for x in bad_rows.read_text().splitlines()]


def all_samples(run_dir):
    ds = PreparedDataset(run_dir)
    return [s for t in range(ds.num_tasks) for s in ds.task_samples(t)]


def _jsonl(path, lines):
    path.write_bytes(b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines))
    return path


def test_lone_surrogate_is_a_bad_row_not_a_crash(tmp_path, smollm2_path, smollm2_tokenizer):
    # A JSON "\ud83d" escape without its pair (emoji cut in half by a scraper) decodes to a string the
    # tokenizer raises on; it used to fail the whole prepare with a TypeError traceback.
    lone = b'{"messages": [{"role": "user", "content": "smile \\ud83d"}, {"role": "assistant", "content": "ok"}]}'
    path = _jsonl(tmp_path / "in.jsonl", [{"messages": CONV}, lone])
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), smollm2_tokenizer)
    assert summary["samples"] == 1 and summary["skipped_by_reason"] == {"invalid_text": 1}
    assert bad[0]["line"] == 2 and bad[0]["file"] == str(path)
    assert bad[0]["detail"].startswith("message 0 (user) holds the lone surrogate '\\ud83d'")


def test_legacy_function_call_is_a_tool_call(tmp_path, smollm2_path):
    # OpenAI's older format: content null and a `function_call`, answered by a `function` message. It was
    # skipped as non_string_content ("content is NoneType").
    row = {
        "messages": [
            U,
            {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}},
            {"role": "function", "name": "get_weather", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ]
    }
    llama = build_family_tokenizer(smollm2_path, "llama3")
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [_jsonl(tmp_path / "in.jsonl", [row])]), llama)
    assert bad == [] and summary["samples"] == 1
    (s,) = all_samples(tmp_path / "run")
    # The call is trained as the assistant wrote it; the function's answer ("sunny") is not.
    assert masked_runs(llama, s.input_ids, s.loss_mask) == [
        '{"name": "get_weather", "parameters": "{}"}<|eot_id|>',
        "It is sunny.<|eot_id|>",
    ]


def test_alpaca_rows_keep_their_input(tmp_path, smollm2_path, smollm2_tokenizer):
    rows = [
        {"instruction": "Translate to English.", "input": "bonjour", "output": "hello"},
        {"instruction": "Say hi.", "input": "", "output": "hi"},
    ]
    summary, bad = run_prepare(
        make_cfg(tmp_path, smollm2_path, [_jsonl(tmp_path / "in.jsonl", rows)]), smollm2_tokenizer
    )
    assert bad == [] and summary["samples"] == 2
    texts = [smollm2_tokenizer.decode(s.input_ids.tolist()) for s in all_samples(tmp_path / "run")]
    assert any("user\nTranslate to English.\n\nbonjour<|im_end|>" in t for t in texts)
    assert sorted(masked_runs(smollm2_tokenizer, s.input_ids, s.loss_mask) for s in all_samples(tmp_path / "run")) == [
        ["hello<|im_end|>"],
        ["hi<|im_end|>"],
    ]


def test_null_columns_name_the_null_field(tmp_path, smollm2_path, smollm2_tokenizer):
    # Parquet gives every row every column: a null response was "unknown_format: row has keys ['prompt',
    # 'response']; expected ... 'prompt'+'response'".
    path = tmp_path / "pr.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "P", "response": "R"}, {"prompt": "P2", "response": None}]), path)
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), smollm2_tokenizer)
    assert summary["samples"] == 1
    assert [(b["row"], b["reason"], b["detail"]) for b in bad] == [(1, "empty_content", "'response' is null")]
    msgs = _jsonl(tmp_path / "m.jsonl", [{"messages": CONV}, {"messages": None}])
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [msgs], name="m"), smollm2_tokenizer)
    assert [(b["reason"], b["detail"]) for b in bad] == [
        ("not_a_list", "'messages' is null, expected a non-empty list of turns")
    ]


def test_a_file_whose_rows_are_all_dropped_says_why(tmp_path, smollm2_path, smollm2_tokenizer):
    """Rows read fine but dropped as samples (a user turn longer than data.max_length leaves no loss token;
    a repeated row is a duplicate): the file's warning names those reasons, not an empty '()'."""
    good = _jsonl(tmp_path / "good.jsonl", [{"prompt": "Hi?", "response": "Hello."}])
    long_rows = [{"prompt": "word " * 400, "response": "ok"}, {"prompt": "Hi?", "response": "Hello."}]
    cfg = make_cfg(tmp_path, smollm2_path, [good, _jsonl(tmp_path / "long.jsonl", long_rows)])
    cfg.data.max_length = 64
    summary, _ = run_prepare(cfg, smollm2_tokenizer)
    assert summary["file_warnings"] == [
        f"{tmp_path / 'long.jsonl'}: none of its 2 rows could be used (duplicate: 1, too_few_loss_tokens: 1)"
    ], summary["file_warnings"]


def test_question_answer_columns_get_the_two_settings_to_read_them(tmp_path, smollm2_path, smollm2_tokenizer):
    rows = [{"id": 1, "question": "2+2?", "answer": "4"}]
    good = _jsonl(tmp_path / "good.jsonl", [{"prompt": "Hi?", "response": "Hello."}])
    cfg = make_cfg(tmp_path, smollm2_path, [good, _jsonl(tmp_path / "qa.jsonl", rows)])
    summary, _ = run_prepare(cfg, smollm2_tokenizer)
    (warning,) = summary["file_warnings"]
    assert warning.endswith(
        ": if 'question' and 'answer' hold one exchange, set data.prompt_field=question data.response_field=answer"
    ), warning
    cfg = make_cfg(tmp_path, smollm2_path, [_jsonl(tmp_path / "qa.jsonl", rows)], name="qa")
    cfg.data.prompt_field, cfg.data.response_field = "question", "answer"
    summary, bad = run_prepare(cfg, smollm2_tokenizer)
    assert summary["samples"] == 1 and bad == []


def test_auto_format_says_what_each_row_was_read_as_and_which_rows_hold_two(tmp_path, smollm2_path, smollm2_tokenizer):
    # A merged export: chat rows, single-turn rows, and rows carrying both (the pair left over from a
    # conversion). auto reads the latter as messages; the summary says so instead of choosing in silence.
    both = {"messages": CONV, "prompt": "Other question?", "response": "Other answer."}
    rows = [{"messages": CONV}, {"prompt": "Q?", "response": "A."}, both, dict(both, id=2)]
    path = _jsonl(tmp_path / "in.jsonl", rows)
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), smollm2_tokenizer)
    assert bad[0]["reason"] == "duplicate" and summary["samples"] == 2
    assert summary["files"][str(path)]["read_as"] == {"messages": 3, "prompt_response": 1}
    assert summary["file_warnings"] == [
        f"{path}: 2 row(s) hold the fields of both the messages and the prompt_response format (first: line 3); "
        "data.format=auto read them as messages; set data.format=prompt_response to read them as prompt_response"
    ]


def test_prompts_without_answers_point_prepare_to_regenerate(tmp_path, smollm2_path, smollm2_tokenizer):
    path = _jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Name a colour."}, {"messages": CONV}])
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), smollm2_tokenizer)
    assert summary["samples"] == 1 and summary["skipped_by_reason"] == {"unknown_format": 1}
    assert bad[0]["line"] == 1 and "`eagle-batch regenerate` has the target write them" in bad[0]["detail"]

"""Readers and formats: every supported file kind and row format, and every kind of bad row."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from eagle_batch.config import ConfigError, DataConfig, ExtractConfig, ModelConfig, RunConfig
from eagle_batch.data import PreparedDataset, prepare
from eagle_batch.data.preparation import BadRowError, NothingToPrepare
from tests.data.conftest import build_family_tokenizer, masked_runs

CONV = [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi there."}]


def make_cfg(tmp_path, smollm2_path, inputs, name="run", **data) -> RunConfig:
    return RunConfig(
        run_dir=str(tmp_path / name),
        model=ModelConfig(path=str(smollm2_path)),
        data=DataConfig(inputs=[str(p) for p in inputs], **data),
        extract=ExtractConfig(num_tasks=1),
    )


def run_prepare(cfg, tok, **kw):
    summary = prepare(cfg, workers=1, progress=False, tokenizer=tok, **kw)
    bad_rows = Path(cfg.run_dir) / "prepared" / "bad_rows.jsonl"
    return summary, [json.loads(x) for x in bad_rows.read_text().splitlines()]


def all_samples(run_dir):
    ds = PreparedDataset(run_dir)
    return [s for t in range(ds.num_tasks) for s in ds.task_samples(t)]


# One JSON Lines row per input problem; the test checks each is reported with its line and reason.
BAD_LINES = [
    ("invalid_json", b"{oops\n"),
    ("undecodable_bytes", b'{"prompt": "caf\xe9", "response": "x"}\n'),
    ("not_an_object", b"[1, 2, 3]\n"),
    ("unknown_format", json.dumps({"text": "hello"}).encode() + b"\n"),
    ("not_a_list", json.dumps({"messages": "hello"}).encode() + b"\n"),
    ("missing_role", json.dumps({"messages": [{"content": "hi"}, CONV[1]]}).encode() + b"\n"),
    ("unknown_role", json.dumps({"messages": [{"role": "narrator", "content": "hi"}, CONV[1]]}).encode() + b"\n"),
    ("non_string_content", json.dumps({"messages": [{"role": "user", "content": 42}, CONV[1]]}).encode() + b"\n"),
    (
        "non_text_content",
        json.dumps(
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}, CONV[1]]}
        ).encode()
        + b"\n",
    ),
    ("empty_content", json.dumps({"messages": [CONV[0], {"role": "assistant", "content": "  "}]}).encode() + b"\n"),
    (
        "bad_tool_calls",
        json.dumps(
            {
                "messages": [
                    CONV[0],
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}],
                    },
                ]
            }
        ).encode()
        + b"\n",
    ),
    ("no_assistant_turn", json.dumps({"messages": [CONV[0]]}).encode() + b"\n"),
    ("unknown_role", json.dumps({"conversations": [{"from": "narrator", "value": "x"}]}).encode() + b"\n"),
    ("empty_content", json.dumps({"prompt": "", "response": "x"}).encode() + b"\n"),
]


def test_every_bad_row_kind_is_counted_with_its_line(tmp_path, smollm2_path, smollm2_tokenizer):
    path = tmp_path / "mixed.jsonl"
    with open(path, "wb") as f:
        f.write(json.dumps({"messages": CONV}).encode() + b"\n")
        for _, line in BAD_LINES:
            f.write(line)
        f.write(b"\n")  # blank lines are not rows
        f.write(json.dumps({"prompt": "2+2?", "response": "4"}).encode() + b"\n")
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), smollm2_tokenizer)
    assert summary["rows_read"] == len(BAD_LINES) + 2 and summary["samples"] == 2
    assert [(b["line"], b["reason"]) for b in bad] == [(i + 2, r) for i, (r, _) in enumerate(BAD_LINES)]
    assert all(b["file"] == str(path) and b["detail"] for b in bad)
    expected = {}
    for r, _ in BAD_LINES:
        expected[r] = expected.get(r, 0) + 1
    assert summary["skipped_by_reason"] == expected


@pytest.mark.parametrize("reason,line", BAD_LINES[:4])
def test_on_bad_row_error_stops_with_file_line_and_fix(tmp_path, smollm2_path, smollm2_tokenizer, reason, line):
    path = tmp_path / "in.jsonl"
    path.write_bytes(json.dumps({"messages": CONV}).encode() + b"\n" + line)
    with pytest.raises(BadRowError) as e:
        prepare(
            make_cfg(tmp_path, smollm2_path, [path], on_bad_row="error"), progress=False, tokenizer=smollm2_tokenizer
        )
    assert f"{path}:2: {reason}" in str(e.value) and "data.on_bad_row=skip" in str(e.value)
    assert not (tmp_path / "run" / "prepared").exists()


def test_template_error_and_not_prefix_stable_are_bad_rows(tmp_path, smollm2_path):
    two_calls = {
        "messages": [
            CONV[0],
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "a", "arguments": {}}},
                    {"type": "function", "function": {"name": "b", "arguments": {}}},
                ],
            },
        ]
    }
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"messages": CONV}) + "\n" + json.dumps(two_calls) + "\n")
    # Llama 3.1's template raises on two tool calls in one turn.
    llama = build_family_tokenizer(smollm2_path, "llama3")
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), llama)
    assert summary["skipped_by_reason"] == {"template_error": 1} and summary["samples"] == 1
    assert "only supports single tool-calls" in bad[0]["detail"]

    multi = {
        "messages": [
            CONV[0],
            {"role": "assistant", "content": "a", "reasoning_content": "r"},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": "b"},
        ]
    }
    path.write_text(json.dumps(multi) + "\n")
    qwen = build_family_tokenizer(smollm2_path, "qwen3")
    cfg = make_cfg(tmp_path, smollm2_path, [path], name="q", non_prefix_stable="error")
    # The only row skipped: nothing is left, so prepare fails, naming the reason (nothing succeeds on nothing).
    with pytest.raises(NothingToPrepare, match=r"\(1 rows read; skipped: not_prefix_stable: 1\)"):
        run_prepare(cfg, qwen)
    cfg.data.non_prefix_stable = "per_turn"
    summary, bad = run_prepare(cfg, qwen)
    assert summary["samples"] == 2 and summary["rows_split_per_turn"] == 1 and summary["rows_kept"] == 1
    assert sorted(masked_runs(qwen, s.input_ids, s.loss_mask) for s in all_samples(tmp_path / "q")) == sorted(
        [["<think>\nr\n</think>\n\na<|im_end|>"], ["<think>\n\n</think>\n\nb<|im_end|>"]]
    )


def test_formats_and_column_names(tmp_path, smollm2_path, smollm2_tokenizer):
    rows = [
        {
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {"role": "user", "content": [{"type": "text", "text": "Two "}, {"type": "text", "text": "parts"}]},
                {"role": "assistant", "content": "Joined."},
            ]
        },
        {"messages": json.dumps(CONV)},  # a JSON string column
        {
            "conversations": [
                {"from": "system", "value": ""},
                {"from": "human", "value": "Q"},
                {"from": "gpt", "value": "A"},
            ]
        },
        {"prompt": "P", "response": "R", "system": "S"},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), smollm2_tokenizer)
    assert bad == [] and summary["samples"] == 4
    texts = {smollm2_tokenizer.decode(s.input_ids.tolist()) for s in all_samples(tmp_path / "run")}
    assert any("<|im_start|>system\nBe terse.<|im_end|>" in t and "Two parts" in t for t in texts)
    assert any("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nP" in t for t in texts)

    # Custom column names, explicit format.
    path2 = tmp_path / "custom.jsonl"
    path2.write_text(
        json.dumps({"dialog": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]})
        + "\n"
        + json.dumps({"question": "q", "answer": "a"})
        + "\n"
    )
    cfg = make_cfg(
        tmp_path,
        smollm2_path,
        [path2],
        name="r2",
        conversations_field="dialog",
        prompt_field="question",
        response_field="answer",
    )
    summary, bad = run_prepare(cfg, smollm2_tokenizer)
    assert summary["samples"] == 2 and bad == []
    cfg = make_cfg(tmp_path, smollm2_path, [path2], name="r3", format="sharegpt", conversations_field="dialog")
    summary, bad = run_prepare(cfg, smollm2_tokenizer)
    assert summary["samples"] == 1 and [b["reason"] for b in bad] == ["not_a_list"]


def test_columnar_files_and_datasets_folders(tmp_path, smollm2_path, smollm2_tokenizer):
    # Parquet/Arrow give every struct field to every message (None where absent); Llama's template tests
    # `'tool_calls' in message`, so Nones must be dropped or plain turns would render as tool calls.
    rows = [
        {"messages": CONV},
        {
            "messages": [
                CONV[0],
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
                    ],
                },
                {"role": "tool", "content": "1", "tool_call_id": "c1"},
                {"role": "assistant", "content": "Done."},
            ]
        },
    ]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "a.parquet")
    feather.write_feather(table, tmp_path / "b.feather")
    with pa.OSFile(str(tmp_path / "c.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    # A datasets.save_to_disk folder: Arrow *stream* files listed in state.json; a DatasetDict above it.
    dd = tmp_path / "dd"
    for split in ("train", "test"):
        (dd / split).mkdir(parents=True)
        with (
            pa.OSFile(str(dd / split / "data-00000-of-00001.arrow"), "wb") as sink,
            pa.ipc.new_stream(sink, table.schema) as w,
        ):
            w.write_table(table)
        (dd / split / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
        (dd / split / "dataset_info.json").write_text("{}")
    (dd / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    (tmp_path / "j.json").write_text(json.dumps(rows))
    inputs = [
        tmp_path / "a.parquet",
        tmp_path / "b.feather",
        tmp_path / "c.arrow",
        dd / "train",
        dd,
        tmp_path / "j.json",
    ]
    llama = build_family_tokenizer(smollm2_path, "llama3")
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, inputs, dedupe=False), llama)
    assert bad == [] and summary["rows_read"] == 2 * 7
    samples = all_samples(tmp_path / "run")
    assert len(samples) == 14 and len({s.sample_id for s in samples}) == 14  # unique ids without dedupe
    runs = sorted({tuple(masked_runs(llama, s.input_ids, s.loss_mask)) for s in samples})
    assert runs == [
        ("Hi there.<|eot_id|>",),
        ('{"name": "f", "parameters": "{\\"x\\": 1}"}<|eot_id|>', "Done.<|eot_id|>"),
    ]
    assert str(dd / "test" / "data-00000-of-00001.arrow") in summary["inputs"]


def test_dedupe_min_loss_tokens_limit_and_truncation(tmp_path, smollm2_path, smollm2_tokenizer):
    long = {"messages": [{"role": "user", "content": "word " * 300}, {"role": "assistant", "content": "ok"}]}
    rows = [{"messages": CONV}, {"messages": CONV}, long] + [
        {"prompt": f"p{i}", "response": f"r{i}"} for i in range(10)
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path], max_length=64, limit=5), smollm2_tokenizer)
    assert summary["rows_read"] == 5
    # The long row is cut inside the user turn: no assistant token left, so it is dropped and reported.
    assert summary["samples_dropped_by_reason"] == {"duplicate": 1, "too_few_loss_tokens": 1}
    assert summary["samples_truncated"] == 1 and summary["samples"] == 3
    assert sorted((b["line"], b["reason"]) for b in bad) == [(2, "duplicate"), (3, "too_few_loss_tokens")]
    assert all(len(s.input_ids) <= 64 for s in all_samples(tmp_path / "run"))

    summary, _ = run_prepare(
        make_cfg(tmp_path, smollm2_path, [path], name="r2", min_loss_tokens=4, dedupe=False), smollm2_tokenizer
    )
    # "Hi there.<|im_end|>" is 4 tokens; "ok<|im_end|>" and "r3<|im_end|>" are fewer.
    assert summary["samples_dropped_by_reason"] == {"too_few_loss_tokens": 11}
    assert summary["samples"] == 2 and len({s.sample_id for s in all_samples(tmp_path / "r2")}) == 2


def test_input_errors_are_config_errors(tmp_path, smollm2_path, smollm2_tokenizer):
    with pytest.raises(ConfigError, match="data.inputs is empty"):
        prepare(make_cfg(tmp_path, smollm2_path, []), tokenizer=smollm2_tokenizer)
    (tmp_path / "x.xlsx").write_text("a,b\n")
    with pytest.raises(ConfigError, match="unsupported file type"):
        prepare(make_cfg(tmp_path, smollm2_path, [tmp_path / "x.xlsx"]), tokenizer=smollm2_tokenizer)
    with pytest.raises(ConfigError, match="on_bad_row"):
        prepare(
            make_cfg(tmp_path, smollm2_path, [tmp_path / "x.xlsx"], on_bad_row="ignore"), tokenizer=smollm2_tokenizer
        )


def test_refuses_to_replace_prepared_data_of_an_extracted_run(tmp_path, smollm2_path, smollm2_tokenizer):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"messages": CONV}) + "\n")
    cfg = make_cfg(tmp_path, smollm2_path, [path])
    prepare(cfg, progress=False, tokenizer=smollm2_tokenizer)
    import numpy as np

    from eagle_batch.config import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    stores = tmp_path / "run" / "stores"
    spec, store_cfg = StoreSpec(layer_ids=[1, 2], hidden_size=8, model_name="m"), StoreConfig(fsync=False)
    # A store an attempt opened but never committed to (its engine failed to start) holds nothing: removed.
    TaskStoreWriter.open(stores / "task-00001.zarr", spec, store_cfg).close()
    assert prepare(cfg, progress=False, tokenizer=smollm2_tokenizer)["samples"] == 1
    assert not (stores / "task-00001.zarr").exists()
    with TaskStoreWriter.open(stores / "task-00000.zarr", spec, store_cfg) as w:
        w.append("s0", np.arange(4, dtype=np.int32), np.ones(4, np.uint8), np.zeros((4, 2, 8), np.uint16))
        w.commit()
    with pytest.raises(ConfigError, match=r"already has extracted stores \(1 with committed samples\)"):
        prepare(cfg, progress=False, tokenizer=smollm2_tokenizer)
    assert prepare(cfg, progress=False, tokenizer=smollm2_tokenizer, force=True)["samples"] == 1


def test_fields_the_template_ignores_are_reported(tmp_path, smollm2_path, smollm2_tokenizer):
    # SmolLM2's ChatML template writes neither reasoning nor tool calls: the rows are kept (the content
    # is still valid training data) and the summary says what was left out.
    rows = [
        {"messages": [CONV[0], {"role": "assistant", "content": "Hi.", "reasoning_content": "Greet back."}]},
        {
            "messages": [
                CONV[0],
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "lookup_user", "arguments": "{}"}}],
                },
                {"role": "tool", "content": "Ann"},
                {"role": "assistant", "content": "Hello Ann."},
            ]
        },
        {"messages": CONV},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), smollm2_tokenizer)
    assert summary["samples"] == 3 and bad == []
    assert summary["rows_with_unrendered_fields"] == {"reasoning_content": 1, "tool_calls": 1}


def test_progress_line_reports_fraction_of_input(tmp_path, smollm2_path, smollm2_tokenizer, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"messages": CONV}) + "\n" for _ in range(3)))
    prepare(make_cfg(tmp_path, smollm2_path, [path]), progress=True, tokenizer=smollm2_tokenizer)
    err = capsys.readouterr().err
    assert "100.0% of input read, 3 rows" in err and "tok/s" in err

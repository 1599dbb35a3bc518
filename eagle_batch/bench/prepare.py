"""`eagle-batch bench prepare`: rows/s and tokens/s of the prepare stage on synthetic conversations.

    eagle-batch bench prepare --json                     # 100k conversations, real SmolLM2 tokenizer
    eagle-batch bench prepare --rows 20000 --workers 1

Conversations are generated (seeded) from word lists: 1-4 user/assistant rounds, some with a system
prompt, lengths drawn from a long-tailed distribution. They are written as JSON Lines and run through
the same `prepare()` the CLI uses (reading, validation, chat template, tokenization, plan, Parquet), so
the numbers are end to end. Rates exclude tokenizer loading and data generation (reported separately).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

from eagle_batch.cli.common import int_at_least

_WORDS = (
    "the a model data token layer state draft batch cluster node job queue memory cache file "
    "value result error test train learn speed fast slow large small first last next good "
    "check run build write read store load plan task array shard answer question because "
    "when where which about there their would could should make take give find think know "
    "python rust matrix vector gradient loss sample window prompt reply format detail"
).split()


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(max(n, 1))]
    return " ".join(words).capitalize() + rng.choice([".", "?", "!", "."])


def _text(rng: random.Random, mean_words: int) -> str:
    total = max(1, int(rng.lognormvariate(0, 0.8) * mean_words))
    out, left = [], total
    while left > 0:
        n = min(left, rng.randint(4, 18))
        out.append(_sentence(rng, n))
        left -= n
    return " ".join(out)


def synthetic_conversation(rng: random.Random) -> dict:
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": _text(rng, 15)})
    for _ in range(rng.choice([1, 1, 2, 2, 3, 4])):
        messages.append({"role": "user", "content": _text(rng, 30)})
        messages.append({"role": "assistant", "content": _text(rng, 90)})
    return {"messages": messages}


def write_synthetic(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps(synthetic_conversation(rng)) + "\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int_at_least(1), default=100_000, help="synthetic conversations (default 100k)")
    p.add_argument("--workers", type=int_at_least(0), default=0, help="tokenizer processes (default: CPU count)")
    p.add_argument("--num-tasks", type=int_at_least(1), default=64, help="array tasks in the shard plan")
    p.add_argument("--model", default="", help="model/tokenizer folder (default: the real SmolLM2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", default="", help="keep the run directory here instead of a temp folder")


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("eagle-batch", "transformers", "tokenizers", "pyarrow", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def _cpu_s() -> float:
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def run(args: argparse.Namespace) -> int:
    from eagle_batch.config import DataConfig, ExtractConfig, ModelConfig, RunConfig
    from eagle_batch.data.preparation import prepare
    from eagle_batch.data.rows import load_tokenizer

    model = args.model
    if not model:
        from eagle_batch.models.smollm2 import materialize

        model = str(materialize())
    workers = args.workers or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="eb-bench-prepare-") as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        data = base / "synthetic.jsonl"
        t0 = time.monotonic()
        write_synthetic(data, args.rows, args.seed)
        gen_s = time.monotonic() - t0
        cfg = RunConfig(
            run_dir=str(base / "run"),
            model=ModelConfig(path=model, max_model_len=4097),
            data=DataConfig(inputs=[str(data)], max_length=4096),
            extract=ExtractConfig(num_tasks=args.num_tasks),
        )
        t0 = time.monotonic()
        tok = load_tokenizer(cfg)
        load_s = time.monotonic() - t0
        load_before = os.getloadavg()[0]
        cpu0 = _cpu_s()
        summary = prepare(cfg, workers=workers, progress=not args.json, tokenizer=tok, force=True)
        cpu_s = _cpu_s() - cpu0
        result = {
            "bench": "prepare",
            "rows": summary["rows_read"],
            "samples": summary["samples"],
            "tokens": summary["tokens"],
            "loss_token_fraction": summary["loss_token_fraction"],
            "workers": workers,
            "process_s": summary["process_s"],
            "rows_per_s": summary["rows_per_s"],
            "tokens_per_s": summary["tokens_per_s"],
            # CPU seconds of this process and its workers during prepare: on a shared machine the
            # wall-clock rates depend on the other load; rows per CPU-second do not (much).
            "cpu_s": round(cpu_s, 2),
            "rows_per_cpu_s": round(summary["rows_read"] / max(cpu_s, 1e-9), 1),
            "tokens_per_cpu_s": round(summary["tokens"] / max(cpu_s, 1e-9), 1),
            "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "generate_s": round(gen_s, 2),
            "tokenizer_load_s": round(load_s, 2),
            "input_mb": round(data.stat().st_size / 1e6, 1),
            "plan_max_over_mean": summary["tasks"]["max_over_mean"],
            "length_percentiles": summary["length_percentiles"],
            "model": model,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.machine()},
            "versions": _versions(),
        }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0

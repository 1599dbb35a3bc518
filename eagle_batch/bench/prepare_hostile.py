"""`eagle-batch bench prepare_hostile`: prepare's peak memory and time on hostile inputs, each beside the
same prepare on the clean rows alone.

    eagle-batch bench prepare_hostile --json          # one 50 MB message, in .jsonl.gz, .json and .csv

Each hostile file holds a few good conversations and one record whose assistant message is `--mb` MB (one
repeated character: the .jsonl.gz is ~50 KB on disk). Every case runs `eagle-batch prepare` in a process
of its own (`--workers 1`: tokenization in that process) and reads its peak resident memory from
wait4's rusage; the clean case is the same good rows without the hostile record, so the ratio
hostile/clean is what the hostile record costs. The data.* caps are the defaults.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle_batch.cli.common import int_at_least

GOOD = [
    {"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]}
    for i in range(5)
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mb", type=int_at_least(1), default=50, help="size of the hostile message in MB (default 50)")
    p.add_argument("--model", default="", help="model/tokenizer folder (default: the real SmolLM2)")


def _hostile(mb: int) -> dict:
    return {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "a" * (mb * 10**6)}]}


def write_cases(base: Path, mb: int) -> dict[str, Path]:
    """{case: input file}: the hostile files and the clean one."""
    big = _hostile(mb)
    rows = GOOD[:2] + [big] + GOOD[2:]
    jsonl = "".join(json.dumps(r) + "\n" for r in rows).encode()
    cases = {"clean.jsonl": base / "clean.jsonl", "hostile.jsonl.gz": base / "hostile.jsonl.gz"}
    cases["clean.jsonl"].write_text("".join(json.dumps(r) + "\n" for r in GOOD))
    cases["hostile.jsonl.gz"].write_bytes(gzip.compress(jsonl, 9))
    cases["hostile.json"] = base / "hostile.json"
    cases["hostile.json"].write_text(json.dumps(rows))
    cases["hostile.csv"] = base / "hostile.csv"
    with open(cases["hostile.csv"], "w") as f:
        f.write("prompt,response\n")
        for i, r in enumerate(rows):
            f.write(f"Question {i}?,{r['messages'][1]['content']}\n")
    return cases


_ROOT = Path(__file__).resolve().parents[2]


def _run_case(model: str, data: Path, run_dir: Path) -> dict:
    """`eagle-batch prepare` of `data` in a process of its own; its peak RSS comes from wait4's rusage."""
    cmd = [sys.executable, "-m", "eagle_batch.cli", "prepare", str(_ROOT / "eagle_batch/configs/demo.yaml")]
    cmd += [f"model.path={model}", f"data.inputs=[{data}]", f"run_dir={run_dir}", "data.format=auto"]
    cmd += ["--workers", "1", "--no-progress"]
    log = run_dir.with_suffix(".log")
    t0 = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    summary = json.loads((run_dir / "prepared" / "summary.json").read_text()) if proc.returncode == 0 else {}
    return {
        "input_bytes": data.stat().st_size,
        "rc": proc.returncode,
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
        "samples": summary.get("samples"),
        "skipped_by_reason": summary.get("skipped_by_reason"),
        "log_tail": log.read_text(errors="replace")[-300:] if proc.returncode else "",
    }


def run(args: argparse.Namespace) -> int:
    model = args.model
    if not model:
        from eagle_batch.models.smollm2 import materialize

        model = str(materialize())
    results = {}
    with tempfile.TemporaryDirectory(prefix="eb-bench-hostile-") as tmp:
        base = Path(tmp)
        for case, path in write_cases(base, args.mb).items():
            results[case] = _run_case(model, path, base / f"run-{case}")
    clean = results["clean.jsonl"]["peak_rss_mb"]
    out = {
        "bench": "prepare_hostile",
        "message_mb": args.mb,
        "cases": results,
        "peak_rss_mb_max_hostile": max(v["peak_rss_mb"] for k, v in results.items() if k != "clean.jsonl"),
        "peak_rss_ratio_max_hostile_over_clean": round(
            max(v["peak_rss_mb"] for k, v in results.items() if k != "clean.jsonl") / clean, 3
        ),
        "model": model,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0

"""The account of a regeneration run: every input row is written (complete or shortened), failed (with its
reason), skipped at planning (with its reason) or still pending, and the counts add up to the rows read.

The failed conversations are listed, with their source file and row, in RUN/regenerate/failures.jsonl;
the skipped rows in RUN/regenerate/prepared/bad_rows.jsonl.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .generate import COUNTS, REASONS
from .plan import PREPARED, SUMMARY
from .shards import read_records

FAILURES = "failures.jsonl"


def regeneration_summary(run_dir: str | os.PathLike) -> dict:
    """Totals over the committed shard records and the plan; also rewrites RUN/regenerate/failures.jsonl."""
    run = Path(run_dir)
    plan = json.loads((run / PREPARED / SUMMARY).read_text())
    totals = dict.fromkeys((*COUNTS, "generate_ms"), 0)
    failures = []
    for rec in read_records(run):
        for k, v in rec["counts"].items():
            totals[k] = totals.get(k, 0) + int(v)
        failures += rec["failures"]
    shortened = {r: totals[f"shortened_{r}"] for r in REASONS if totals[f"shortened_{r}"]}
    failed = {r: totals[f"failed_{r}"] for r in REASONS if totals[f"failed_{r}"]}
    written = totals["complete"] + sum(shortened.values())
    settled = written + sum(failed.values())
    out = {
        "rows_read": plan["rows_read"],
        "written": written,
        "complete": totals["complete"],
        "shortened": shortened,
        "failed": failed,
        "skipped": plan["skipped_by_reason"],
        "pending": plan["conversations"] - settled,
        "turns_written": totals["turns_written"],
        "answers_cut_off": totals["answers_cut_off"],
        "prompt_tokens": totals["prompt_tokens"],
        "tokens_generated": totals["tokens_generated"],
        # Engine time of the committed batches, summed over tasks (excludes engine start-up).
        "generate_s": round(totals["generate_ms"] / 1000, 1),
        "output": str(run / "output"),
        "failures_file": str(run / FAILURES),
    }
    out["accounted"] = settled + out["pending"] + sum(plan["skipped_by_reason"].values()) == plan["rows_read"]
    (run / FAILURES).write_text("".join(json.dumps(f) + "\n" for f in failures))
    return out


def _by_reason(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))


def summary_lines(s: dict) -> list[str]:
    lines = [
        f"regenerated {s['output']}",
        f"  rows: {s['rows_read']} read = {s['written']} written + {sum(s['failed'].values())} failed + "
        f"{sum(s['skipped'].values())} skipped + {s['pending']} pending"
        + ("" if s["accounted"] else "  (DOES NOT ADD UP: please report)"),
        f"  written: {s['complete']} complete"
        + (f", {sum(s['shortened'].values())} ending early ({_by_reason(s['shortened'])})" if s["shortened"] else ""),
    ]
    if s["failed"]:
        lines.append(f"  failed: {_by_reason(s['failed'])} (listed in {s['failures_file']})")
    if s["skipped"]:
        lines.append(f"  skipped: {_by_reason(s['skipped'])} (listed in prepared/bad_rows.jsonl)")
    if s["answers_cut_off"]:
        lines.append(f"  {s['answers_cut_off']} answer(s) reached regenerate.max_tokens (finish reason 'length')")
    rate = f", {s['tokens_generated'] / s['generate_s']:.0f} tokens/s while generating" if s["generate_s"] else ""
    lines.append(f"  {s['turns_written']} assistant turns written, {s['tokens_generated']} tokens generated{rate}")
    return lines


# What to change when every conversation failed for one reason.
FIXES = {
    "cut_off": "raise regenerate.max_tokens, or set regenerate.keep_cut_off=true to keep answers cut at it",
    "too_long": "raise model.max_model_len, or give shorter conversations",
    "empty_output": "check model.path and the chat template (model.chat_template): the model answered nothing",
}


def nothing_written(s: dict) -> str:
    """The error of a finished run that wrote no conversation ('' when it wrote one, or some are pending)."""
    if s["written"] or s["pending"]:
        return ""
    fixes = "; ".join(f"{r}: {FIXES[r]}" for r in sorted(s["failed"]) if r in FIXES)
    return (
        f"nothing was regenerated: all {sum(s['failed'].values())} conversation(s) failed "
        f"({_by_reason(s['failed'])}; listed in {s['failures_file']}), so {s['output']} holds no row. "
        + (f"{fixes}; then plan again with a new regenerate.run_dir." if fixes else "")
    ).strip()

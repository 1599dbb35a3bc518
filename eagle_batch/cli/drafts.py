"""`eagle-batch drafts RUN [--json]`: the drafts trained from one run (a sweep's tasks, pipelined or not), ranked.

One row per RUN/train/<name>: its status (done with an export, or how far it got), steps, and the held-out
figures of result.json (train.holdout_fraction > 0): the teacher-forced acceptance length and the loss. Rows are
ranked by held-out acceptance (highest first), then by held-out loss; drafts without held-out figures come last.
Exit 1 when no draft of RUN has finished.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="the run folder whose train/ holds the drafts")
    p.add_argument("--json", action="store_true", help="one JSON object per draft instead of a table")


def _last_step(out: Path) -> int:
    latest = out / "checkpoints" / "latest"
    try:
        return int(latest.read_text().strip().removeprefix("step-").removesuffix(".pt"))
    except (OSError, ValueError):
        return 0


def draft_rows(run_dir: Path) -> list[dict]:
    """Every draft folder of RUN/train, with its result and held-out figures, ranked."""
    rows = []
    for out in sorted(p for p in (run_dir / "train").glob("*") if p.is_dir()):
        result_file = out / "result.json"
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
        held = result.get("heldout") or {}
        rows.append(
            {
                "name": out.name,
                "status": result.get("status", "unfinished"),
                "step": int(result.get("step", _last_step(out))),
                "heldout_acceptance_length": held.get("acceptance_length"),
                "heldout_loss": held.get("loss"),
                "heldout_samples": held.get("samples", 0),
                "export_dir": result.get("export_dir", ""),
            }
        )

    def rank(r: dict) -> tuple:
        acc, loss = r["heldout_acceptance_length"], r["heldout_loss"]
        return (acc is None, -(acc or 0.0), loss if loss is not None else float("inf"), r["name"])

    return sorted(rows, key=rank)


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    if not (run_dir / "train").is_dir():
        print(f"eagle-batch drafts: {run_dir} has no train/ folder: no draft was trained from it yet", file=sys.stderr)
        return 2
    rows = draft_rows(run_dir)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"{'rank':>4}  {'draft':<24} {'status':<10} {'steps':>7}  {'held-out accept':>15}  {'held-out loss':>13}")
        for i, r in enumerate(rows, 1):
            acc = f"{r['heldout_acceptance_length']:.3f}" if r["heldout_acceptance_length"] is not None else "-"
            loss = f"{r['heldout_loss']:.4f}" if r["heldout_loss"] is not None else "-"
            print(f"{i:>4}  {r['name']:<24} {r['status']:<10} {r['step']:>7}  {acc:>15}  {loss:>13}")
        if not any(r["heldout_acceptance_length"] is not None for r in rows):
            print("(no held-out figures: train with train.holdout_fraction > 0 to rank drafts)")
    return 0 if any(r["status"] == "done" for r in rows) else 1

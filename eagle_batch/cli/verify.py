"""`eagle-batch verify PATH`: re-check a task store or every store of a run; exit 1 if anything is wrong."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="a run folder, or one task store (RUN/stores/task-00000.zarr)")
    p.add_argument(
        "--no-values",
        action="store_true",
        help="check files and checksums only; skip decoding (faster; no NaN/Inf or raw-crc checks)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (there is none outside a terminal)")
    p.add_argument("--json", action="store_true", help="print the problems as one JSON object")


def run(args: argparse.Namespace) -> int:
    from eagle_batch.progress import progress
    from eagle_batch.store.errors import StoreError
    from eagle_batch.store.record import committed_samples
    from eagle_batch.store.verify import store_paths, verify

    try:
        stores = store_paths(Path(args.path))
        bar = functools.partial(progress, desc="verify", unit="store", enabled=not args.no_progress)
        problems = verify(args.path, check_values=not args.no_values, each=bar)
    except StoreError as e:
        print(f"eagle-batch verify: {e}", file=sys.stderr)
        return e.exit_code
    samples = sum(committed_samples(s) for s in stores)
    if args.json:
        print(
            json.dumps(
                {
                    "path": args.path,
                    "stores": len(stores),
                    "ok": not problems,
                    "problems": [p.to_dict() for p in problems],
                }
            )
        )
    else:
        for p in problems:
            print(p)
        if problems:
            damaged = sorted({p.store for p in problems})
            print(
                f"{len(problems)} problem(s) in {len(damaged)} of {len(stores)} store(s). Stray files go away when "
                "the store is reopened for writing (`eagle-batch resume`); damaged shards need "
                "`eagle-batch resume --repair` (recomputes the samples listed) or deleting the store.",
                file=sys.stderr,
            )
        elif samples == 0:
            print(
                f"eagle-batch verify: {args.path}: "
                + (f"the {len(stores)} store(s) hold no committed samples" if stores else "no task store")
                + ": nothing to verify (nothing was extracted; see "
                "`eagle-batch status RUN`)",
                file=sys.stderr,
            )
        else:
            print(f"OK: {len(stores)} store(s), {samples} samples verified")
    return 1 if problems else 2 if samples == 0 else 0  # nothing extracted yet: the run's stage, not damage

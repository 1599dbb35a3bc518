"""`eagle-batch verify PATH`: re-check a task store or every store of a run; exit 1 if anything is wrong."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from eagle_batch.cli.common import int_at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        metavar="PATH",
        help="a task store (RUN/stores/task-00000.zarr), a run directory (its stores, its dataset.json and its "
        "trained drafts' provenance), or a derived output (an export-data folder, a draft's export folder): "
        "is it stale relative to the stores it was made from?",
    )
    p.add_argument(
        "--no-values",
        action="store_true",
        help="check files and checksums only; skip decoding (faster; no NaN/Inf or raw-crc checks)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (there is none outside a terminal)")
    p.add_argument("--json", action="store_true", help="print the problems as one JSON object")
    p.add_argument(
        "--jobs",
        type=int_at_least(1),
        default=4,
        help="stores checked at once (threads; default 4): a run of many stores is then bound by the disk",
    )


def run(args: argparse.Namespace) -> int:
    from eagle_batch.progress import progress
    from eagle_batch.store.errors import StoreError
    from eagle_batch.store.provenance import SOURCES_NAME, derived_outputs, stale_report
    from eagle_batch.store.record import committed_samples
    from eagle_batch.store.verify import store_paths, verify

    stale = [line for out in derived_outputs(Path(args.path)) if (line := stale_report(out))]
    if (Path(args.path) / SOURCES_NAME).is_file():  # a derived output (a draft, an export), not a run
        print("\n".join(stale) or f"OK: {args.path} is current with the stores it was made from")
        return 1 if stale else 0
    try:
        stores = store_paths(Path(args.path))
        bar = functools.partial(progress, desc="verify", unit="store", enabled=not args.no_progress)
        problems = verify(args.path, check_values=not args.no_values, each=bar, jobs=args.jobs)
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
                    "stale": stale,
                }
            )
        )
    else:
        for p in problems:
            print(p)
        for line in stale:
            print(line)
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
    # nothing extracted yet: the run's stage (2), not damage
    return 1 if problems or stale else 2 if samples == 0 else 0

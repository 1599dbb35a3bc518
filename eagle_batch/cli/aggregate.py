"""`eagle-batch aggregate RUN`: write RUN/dataset.json over the complete task stores; list the others."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run folder (holds stores/)")
    p.add_argument(
        "--require-all", action="store_true", help="exit 1 if any task store is incomplete (the index is still written)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (there is none outside a terminal)")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of text")


def run(args: argparse.Namespace) -> int:
    from eagle_batch.progress import progress
    from eagle_batch.store.aggregate import aggregate, left_out, previous_index
    from eagle_batch.store.errors import StoreError

    t0 = time.perf_counter()
    before = previous_index(args.run_dir)
    try:
        bar = functools.partial(progress, desc="aggregate", unit="store", enabled=not args.no_progress)
        # Refuses (and writes nothing) when no store is complete or none holds a sample.
        index = aggregate(args.run_dir, each=bar)
    except StoreError as e:
        print(f"eagle-batch aggregate: {e}", file=sys.stderr)
        return e.exit_code  # 1: a store is damaged; 2: nothing complete to aggregate yet
    seconds = time.perf_counter() - t0
    n_ok, inc = len(index["stores"]), index["incomplete"]
    # A new index with fewer stores than the one it replaced is the run as it is now (the old one pointed at
    # stores that are gone or being rewritten), but never silently: say which stores left it and why.
    gone = left_out(before, index)
    if gone:
        print(
            f"warning: {args.run_dir}/dataset.json listed {before.get('num_samples')} samples before, now "
            f"{index['num_samples']}; left out: " + "; ".join(gone) + ". Finish unfinished stores with "
            "`eagle-batch resume RUN`, then aggregate again.",
            file=sys.stderr,
        )
    if args.json:
        print(
            json.dumps(
                {
                    "run_dir": args.run_dir,
                    "complete_stores": n_ok,
                    "num_samples": index["num_samples"],
                    "num_tokens": index["num_tokens"],
                    "incomplete": inc,
                    "seconds": round(seconds, 4),
                }
            )
        )
    else:
        print(
            f"{args.run_dir}/dataset.json: {n_ok} complete store(s), {index['num_samples']} samples, "
            f"{index['num_tokens']} tokens ({seconds:.2f} s)"
        )
        for e in inc:
            print(
                f"incomplete: {e['path']} ({e['committed_samples']} samples committed); "
                "run `eagle-batch resume RUN` to finish it, then aggregate again",
                file=sys.stderr,
            )
    return 1 if (inc and args.require_all) else 0

"""Stress: SIGKILL store writers at >= 50 random moments, resume each, compare with an uninterrupted run.

    python tests/stress/kill_writer.py [--min-kills 50] [--kills-per-store 6] [--workdir DIR] [--seed 0]
                                       [--dtype bfloat16|float8_e4m3|float8_e5m2]

Not collected by pytest (no test_ prefix). Each store is written by a child process (120 samples,
commit every 3, 8-token chunks in 32-token shards so every kill lands among many shard writes); after
every kill the store must show a committed prefix of the reference (via the record, the reader, and
plain zarr which trusts shapes); after the final resume it must equal the uninterrupted run, down to
the shard files' crc32c. Results go to docs/explanation/reliability.md ("Store kill trials").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))

from store_testlib import kill_trials  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills-per-store", type=int, default=6)
    p.add_argument("--stores", type=int, default=1)
    p.add_argument("--min-kills", type=int, default=50, help="add stores until this many kills landed")
    p.add_argument("--samples", type=int, default=120)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where the stores go (default: a temporary folder)")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float8_e4m3", "float8_e5m2"],
        help="the stores' store.dtype",
    )
    args = p.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=args.workdir) as d:
        result = kill_trials(
            Path(d),
            args.kills_per_store,
            args.stores,
            n_samples=args.samples,
            seed=args.seed,
            log=lambda m: print(m, flush=True),
            min_kills=args.min_kills,
            dtype=args.dtype,
        )
    c = result["committed_at_kill"]
    summary = {
        "dtype": args.dtype,
        "kills": result["kills"],
        "stores": result["stores"],
        "killed_with_nothing_committed": sum(x == 0 for x in c),
        "killed_mid_run": sum(0 < x < args.samples for x in c),
        "killed_after_last_sample_committed": sum(x == args.samples for x in c),
        "committed_at_kill": c,
        "result": "all resumed stores identical to the uninterrupted run; no zero reads",
        "seconds": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

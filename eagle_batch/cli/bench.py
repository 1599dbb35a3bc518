"""`eagle-batch bench NAME ...`: dispatch to `eagle_batch.bench.<NAME>` (add_arguments / run)."""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHES = {
    "store": "write/read hidden states of the real SmolLM2 through the Zarr store",
    "prepare": "rows/s and tokens/s of prepare on synthetic conversations",
    "prepare_hostile": "prepare's peak memory on hostile inputs (one 50 MB message in .jsonl.gz/.json/.csv)",
    "capture": "plain prefill vs eagle-batch capture vs vLLM's stock connector, one run",
    "slurm": "submit-to-done wall time of a trivial Slurm array",
    "slurm_run": "a synthetic run on Slurm split at MaxArraySize, tasks killed and cancelled, resume, read back",
    "loader": "samples/s and MB/s of the training data path",
    "scale": "metadata calls, wall time and memory of each verb on runs of N tasks",
    "pipeline": "extract-to-draft time and held-out loss: train --follow against training after extraction",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=sorted(BENCHES), help="; ".join(f"{k}: {v}" for k, v in BENCHES.items()))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own arguments (NAME --help)")


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"eagle_batch.bench.{args.name}")
    parser = argparse.ArgumentParser(prog=f"eagle-batch bench {args.name}", description=BENCHES[args.name])
    parser.add_argument("--json", action="store_true", help="print only the JSON result object")
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(args.rest)) or 0)


if __name__ == "__main__":
    sys.exit(run(argparse.Namespace(name=sys.argv[1], rest=sys.argv[2:])))

"""`eagle-batch import-data SRC STORE --aux-layer-ids ... --num-hidden-layers N`: a speculators offline data
folder (prepare-data + generate-offline-data output) -> one eagle-batch task store; rerun to resume."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "src",
        metavar="SRC",
        help="speculators data folder (the save_to_disk dataset with hidden_states/hs_{i}.safetensors)",
    )
    p.add_argument("store", metavar="STORE", help="the task store to write, e.g. RUN/stores/task-00000.zarr")
    p.add_argument(
        "--aux-layer-ids",
        type=int,
        nargs="+",
        metavar="ID",
        required=True,
        help="the aux layers the files hold, ascending, in vLLM's convention (speculators' --target-layer-ids)",
    )
    p.add_argument(
        "--num-hidden-layers", type=int, required=True, metavar="N", help="the target's number of decoder layers N"
    )
    p.add_argument("--model-name", default="", help="the target's name, recorded in the store's attributes")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (there is none outside a terminal)")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of text")


def run(args: argparse.Namespace) -> int:
    from eagle_batch.interop.importer import import_speculators
    from eagle_batch.progress import progress

    bar = functools.partial(progress, desc="import", unit="sample", enabled=not args.no_progress)
    out = import_speculators(
        Path(args.src),
        Path(args.store),
        args.aux_layer_ids,
        args.num_hidden_layers,
        model_name=args.model_name,
        each=bar,
    )
    if args.json:
        print(json.dumps(out))
    else:
        if out.get("replaced_empty_store"):
            print(
                f"note: {out['store']} was left by an earlier attempt with other options and no committed "
                "sample; it was replaced",
                file=sys.stderr,
            )
        print(
            f"{out['store']}: {out['added']} samples added, {out['skipped']} already there; layers {out['layer_ids']}"
        )
    return 0

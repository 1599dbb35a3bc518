"""`eagle-batch export-data RUN --format speculators|specforge OUT`: a run's hidden states as the files
speculators or SpecForge train on (docs/how-to/export.md); rerun to resume."""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

FORMATS = ("speculators", "specforge")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="PATH", help="a run folder (aggregated: RUN/dataset.json) or one task store")
    p.add_argument(
        "out", metavar="OUT", help="output folder (new or empty, or an earlier export of the same data to resume)"
    )
    p.add_argument("--format", required=True, choices=FORMATS, help="the peer trainer whose files to write")
    p.add_argument(
        "--target",
        default="",
        metavar="MODEL_DIR",
        help="the target model folder: its final norm (specforge) and its number of decoder layers when the "
        "store does not record it (default: model.path of RUN/config.yaml)",
    )
    p.add_argument(
        "--num-hidden-layers",
        type=int,
        default=0,
        metavar="N",
        help="the target's number of decoder layers N, for stores that do not record it",
    )
    p.add_argument(
        "--on-damaged",
        choices=("fail", "skip"),
        default="fail",
        help="a sample whose stored data fail their checksum: fail (default: stop, naming the store, chunk and "
        "samples) or skip (write every other sample, name each skipped one; the export stays incomplete "
        "until they are repaired with `eagle-batch resume RUN --repair` and export-data is run again)",
    )
    p.add_argument("--no-fsync", action="store_true", help="do not fsync each file (faster; not crash-safe)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (there is none outside a terminal)")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of text")


def _target(args: argparse.Namespace) -> str:
    """--target, else the run's model.path (RUN/config.yaml), else ""."""
    if args.target:
        return args.target
    src = Path(args.source)
    if (src / "config.yaml").is_file():
        from eagle_batch.config import load_run_config

        return str(load_run_config(src).model.path)
    return ""


def _num_hidden_layers(args: argparse.Namespace, recorded: int, target: str) -> int:
    from eagle_batch.errors import UserError

    if args.num_hidden_layers and recorded and args.num_hidden_layers != recorded:
        raise UserError(
            f"--num-hidden-layers {args.num_hidden_layers} but {args.source} records num_hidden_layers="
            f"{recorded}; leave the option out"
        )
    if recorded or args.num_hidden_layers:
        return recorded or args.num_hidden_layers
    if target:
        from eagle_batch.config import model_info

        return model_info(target).num_hidden_layers
    return 0


def _peer(args: argparse.Namespace, layers, target: str):
    from eagle_batch.errors import UserError

    if args.format == "speculators":
        from eagle_batch.interop.speculators import SpeculatorsFormat

        return SpeculatorsFormat(layers)
    if not target:
        raise UserError(
            "--format specforge needs the target's final norm: pass --target MODEL_DIR (a run directory's "
            "config.yaml names it otherwise)"
        )
    from eagle_batch.config import model_info
    from eagle_batch.interop.specforge import SpecForgeFormat
    from eagle_batch.train.target import final_norm_weight

    try:
        weight = final_norm_weight(target)
    except (FileNotFoundError, KeyError) as e:
        raise UserError(f"--target {target}: {e.args[0]}") from None
    return SpecForgeFormat(layers, weight, model_info(target).rms_norm_eps)


def run(args: argparse.Namespace) -> int:
    from eagle_batch.errors import UserError
    from eagle_batch.interop.export import check_out_folder, export
    from eagle_batch.interop.layers import peer_layers
    from eagle_batch.progress import progress
    from eagle_batch.store import open_dataset

    check_out_folder(Path(args.out), "OUT", "an export")  # before the source is read: nothing is half done
    ds = open_dataset(args.source)
    if len(ds) == 0:
        raise UserError(f"{args.source}: no committed sample to export (see `eagle-batch status RUN`)")
    target = _target(args)
    n = _num_hidden_layers(args, ds.spec.num_hidden_layers, target)
    layers = peer_layers(ds.layer_ids, n, args.source)
    peer = _peer(args, layers, target)
    bar = functools.partial(progress, unit="sample", enabled=not args.no_progress)
    result = export(
        ds,
        str(args.source),
        Path(args.out),
        peer,
        fsync=not args.no_fsync,
        each=functools.partial(bar, desc=f"export {args.format}"),
        each_token=functools.partial(bar, desc="index"),
        on_damaged=args.on_damaged,
    )
    summary = {
        "out": str(result.out),
        "format": args.format,
        "samples": result.num_samples,
        "written": result.written,
        "skipped": result.skipped,
        **result.summary,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{result.out}: {result.num_samples} samples as {args.format} ({result.written} written, "
            f"{result.skipped} already there); layer ids for the trainer: {json.dumps(result.summary['peer_layer_ids'])}"
        )
    return 0

"""`eagle-batch validate RUN --samples K`: re-compute K captured samples with transformers and compare.

Reads the run's resolved config (model path, dtype, layer ids, thresholds) and its stores
(`eagle_batch.store.open_dataset`: the aggregated run if `aggregate` ran, else each task store), picks K
samples spread over the run (seeded), runs the transformers reference (`capture.hf`) and prints the
per-layer report (`capture.validate`). Exit status 1 when a layer fails its thresholds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eagle_batch.cli.common import int_at_least
from eagle_batch.config.remote_code import engine_remote_code
from eagle_batch.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN", help="run folder (with config.yaml and stores/)")
    p.add_argument("--samples", type=int_at_least(1), default=8, help="number of samples to compare (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="torch device for the reference (default: cuda if available)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float16", "float32"],
        help="reference dtype (default: model.dtype of the run)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (there is none outside a terminal)")


def _datasets(run_dir: Path):
    from eagle_batch.store import StoreError, open_dataset

    if (run_dir / "dataset.json").is_file():
        return [open_dataset(run_dir)]
    stores = sorted((run_dir / "stores").glob("task-*.zarr"))
    if not stores:
        raise StoreError(f"{run_dir}: no dataset.json and no stores/task-*.zarr; run `eagle-batch extract` first")
    return [open_dataset(p) for p in stores]


def validate_run(
    run_dir: str | Path,
    k: int,
    seed: int = 0,
    device: str | None = None,
    dtype: str | None = None,
    show_progress: bool = True,
):
    import numpy as np

    from eagle_batch.capture.hf import hf_hidden_states, load_hf_model
    from eagle_batch.capture.validate import LayerAccumulator
    from eagle_batch.config import load_run_config, model_info, resolve_layer_ids
    from eagle_batch.progress import progress, silence_library_progress
    from eagle_batch.store import StoreError

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    layer_ids = resolve_layer_ids(cfg.model, model_info(cfg.model.path))
    dss = _datasets(run_dir)
    index = [(d, i) for d, ds in enumerate(dss) for i in range(len(ds))]
    if not index:
        raise StoreError(
            f"{run_dir}: the stores hold no committed samples: nothing to validate (see `eagle-batch status {run_dir}`)"
        )
    rng = np.random.default_rng(seed)
    picks = sorted(rng.choice(len(index), size=min(k, len(index)), replace=False).tolist())
    if not show_progress:
        silence_library_progress()
    model = load_hf_model(cfg.model.path, dtype or cfg.model.dtype, device, engine_remote_code(cfg.model))
    acc = LayerAccumulator(layer_ids)
    for p in progress(picks, desc="validate", unit="sample", enabled=show_progress):
        d, i = index[p]
        rec = dss[d][i]
        ref = hf_hidden_states(model, rec["input_ids"], layer_ids).cpu()
        acc.add(str(rec["sample_id"]), rec["hidden_states"], ref)
    return acc.report(cfg.extract.validate_min_cosine, cfg.extract.validate_max_rel_err)


def check_device(device: str | None) -> None:
    """The reference's torch device must exist here; checked before the model is loaded."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"--device {device}: not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise UserError(f"--device {device}: no such CUDA device here ({torch.cuda.device_count()} visible); use cpu")
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"--device {device}: the reference runs on cpu or cuda")


def run(args: argparse.Namespace) -> int:
    check_device(args.device)
    rep = validate_run(args.run_dir, args.samples, args.seed, args.device, args.dtype, not args.no_progress)
    print(json.dumps(rep.as_dict(), indent=2) if args.json else rep.table())
    return 0 if rep.passed else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="eagle-batch validate")
    add_arguments(ap)
    sys.exit(run(ap.parse_args()))

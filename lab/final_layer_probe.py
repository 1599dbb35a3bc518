"""Which state a run stored as its last layer (id N), shown against transformers.

    python lab/final_layer_probe.py RUN [--samples 4] [--device cuda] [--dtype bfloat16]

eagle-batch stores id N as the output of the last decoder layer BEFORE the final norm (eagle_batch/capture/
layers.py), the state EAGLE-3 training applies the target's norm and lm_head to. transformers'
`output_hidden_states[N]` is the state AFTER the final norm, and `[N-1]` is one layer early: the two
off-by-ones a store can make. For a few stored samples this runs the run's transformers reference and
compares the stored id-N state with each candidate:

- `pre_norm`: the raw output of decoder layer N-1 (a forward hook): expected to agree (cosine ~1, rel ~bf16);
- `hidden_states_N`: transformers' last `output_hidden_states` entry (normed): expected to differ, in scale
  always and in direction when the final norm's scale is not all ones;
- `norm(stored)` vs `hidden_states_N`: the target's final RMSNorm applied to the stored state gives
  transformers' last entry: expected to agree;
- `hidden_states_N-1`: the output of one layer earlier: expected to differ.

Prints one JSON object: per candidate the mean and minimum per-token cosine and the relative L2 error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def _dataset(run: Path):
    from eagle_batch.store import open_dataset

    if (run / "dataset.json").is_file():
        return open_dataset(run)
    stores = sorted((run / "stores").glob("task-*.zarr"))
    if not stores:
        raise SystemExit(f"{run}: no dataset.json and no stores/task-*.zarr")
    return open_dataset(stores[0])


def _compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.double(), b.double()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    rel = (a - b).norm() / b.norm()
    return {"cos_mean": float(cos.mean()), "cos_min": float(cos.min()), "rel_l2": float(rel)}


def probe(run: Path, samples: int, device: str | None, dtype: str | None) -> dict:
    from eagle_batch.capture.hf import _decoder_layers, load_hf_model
    from eagle_batch.config import load_run_config, model_info

    cfg = load_run_config(run)
    ds = _dataset(run)
    n_layers = model_info(cfg.model.path).num_hidden_layers
    if ds.layer_ids[-1] != n_layers:
        raise SystemExit(f"{run}: the last stored id is {ds.layer_ids[-1]}, not N = {n_layers}")
    model = load_hf_model(cfg.model.path, dtype or cfg.model.dtype, device, cfg.model.trust_remote_code)
    norm = model.model.norm
    captured: dict[str, torch.Tensor] = {}
    hook = _decoder_layers(model)[n_layers - 1].register_forward_hook(
        lambda _m, _i, out: captured.__setitem__("pre", out[0] if isinstance(out, tuple) else out)
    )
    rows: dict[str, list[dict]] = {"pre_norm": [], "hidden_states_N": [], "norm_of_stored_vs_hidden_states_N": []}
    rows["hidden_states_N-1"] = []
    dev = next(model.parameters()).device
    try:
        for i in range(min(samples, len(ds))):
            rec = ds[i]
            stored = torch.as_tensor(rec["hidden_states"])[:, -1].to(dev)
            ids = torch.as_tensor(rec["input_ids"], dtype=torch.long, device=dev)[None]
            with torch.no_grad():
                out = model(input_ids=ids, output_hidden_states=True, use_cache=False, logits_to_keep=1)
                normed = norm(stored.to(norm.weight.dtype))
            hs = out.hidden_states
            rows["pre_norm"].append(_compare(stored, captured["pre"][0]))
            rows["hidden_states_N"].append(_compare(stored, hs[n_layers][0]))
            rows["norm_of_stored_vs_hidden_states_N"].append(_compare(normed, hs[n_layers][0]))
            rows["hidden_states_N-1"].append(_compare(stored, hs[n_layers - 1][0]))
    finally:
        hook.remove()
    w = norm.weight.detach().float()
    summary = {
        k: {
            "cos_mean": sum(r["cos_mean"] for r in v) / len(v),
            "cos_min": min(r["cos_min"] for r in v),
            "rel_l2_max": max(r["rel_l2"] for r in v),
        }
        for k, v in rows.items()
    }
    return {
        "run": str(run),
        "model": cfg.model.path,
        "num_hidden_layers": n_layers,
        "stored_layer_ids": list(ds.layer_ids),
        "samples": min(samples, len(ds)),
        "final_norm_scale": {"min": float(w.min()), "max": float(w.max()), "mean": float(w.mean())},
        "stored_id_N_vs": summary,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, help="reference dtype (default: the run's model.dtype)")
    a = ap.parse_args(argv)
    print(json.dumps(probe(a.run, a.samples, a.device, a.dtype), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

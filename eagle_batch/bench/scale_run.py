"""Build a run of N tasks as an extraction leaves it, without a model: `build_run(run_dir, N, ...)`.

Everything is written by the code a real run uses, only the hidden states are synthetic:
- RUN/config.yaml (`save_config`) over a tiny local model folder (`models.tiny`, for the store spec);
- RUN/prepared/samples.parquet, plan.json, summary.json (prepare's own writers: `plan_lpt`, `_write_samples`);
- RUN/slurm/submissions.jsonl (`state.append_submission`: one Slurm array over every task) and each task's
  log file where submitit puts it;
- per task, what `capture_work` and `ArrayTask` do: `TaskStoreWriter.open(..., on_commit=record.report)`,
  appends, commits, `finalize` and the attempt's end (`task._AttemptRecord`, which writes RUN/state/).

A random `failed_fraction` of tasks failed after their first commit (state `failed`, store unfinished) and a
`missing_fraction` never ran (no store, no state file). The first task's writes are counted with
`bench.oscalls.MetadataCalls` (`TaskWrites`): the task side's metadata load per open, commit and finalize.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .oscalls import MetadataCalls

FAKE_ARRAY_JOB = "990000001"  # an array job id no Slurm knows: sacct/squeue answer nothing for it


@dataclass
class RunShape:
    """What each synthetic task holds (small so that 10,000 stores fit a laptop disk)."""

    samples_per_task: int = 4
    tokens_per_sample: int = 24
    hidden_size: int = 64
    num_hidden_layers: int = 4
    chunk_tokens: int = 16
    shard_tokens: int = 64
    commits_per_task: int = 2
    failed_fraction: float = 0.005
    missing_fraction: float = 0.005
    seed: int = 0
    # Task stores written through TaskStoreWriter (spread over the run, each fate at least once); the others
    # are file-for-file copies of the last one written with the same fate (a store takes ~0.3 s to write here,
    # a copy ~10 ms). Every task's state file is written by the task's own code path either way.
    written_stores: int = 100


@dataclass
class TaskWrites:
    """Metadata calls of one task's writes (the first task built), by phase, plus the bytes it holds."""

    open: dict = field(default_factory=dict)  # TaskStoreWriter.open + the attempt's first state write
    commit: list[dict] = field(default_factory=list)  # per commit: writer.commit + the state update
    finalize: dict = field(default_factory=dict)  # writer.finalize + close + the attempt's end


def model_folder(shape: RunShape) -> Path:
    """The tiny local model whose config.json and tokenizer give the store spec (built once, cached)."""
    from eagle_batch.models.smollm2 import cache_root
    from eagle_batch.models.tiny import build_tiny_model

    kw = {"hidden_size": shape.hidden_size, "num_hidden_layers": shape.num_hidden_layers}
    suffix = "-".join(f"{k}{v}" for k, v in sorted(kw.items()))
    return build_tiny_model("llama", cache_root() / "models" / f"tiny-llama-{suffix}", **kw)


def _config(run: Path, n: int, shape: RunShape):
    from eagle_batch.config import load_config, save_config

    cfg = load_config(
        None,
        [
            f"run_dir={run}",
            f"model.path={model_folder(shape)}",
            f"extract.num_tasks={n}",
            f"store.chunk_tokens={shape.chunk_tokens}",
            f"store.shard_tokens={shape.shard_tokens}",
            "store.fsync=false",
            "store.encode_threads=1",
            "store.io_threads=1",
        ],
    )
    save_config(cfg, run)
    return cfg


def _prepared(run: Path, n: int, shape: RunShape, rng: np.random.Generator) -> None:
    from eagle_batch.data.plan import plan_lpt
    from eagle_batch.data.preparation import _write_samples
    from eagle_batch.data.tally import Sample

    out = run / "prepared"
    out.mkdir(parents=True, exist_ok=True)
    count = n * shape.samples_per_task
    samples = [
        Sample(
            f"s{i:08d}",
            rng.integers(3, 1000, shape.tokens_per_sample, dtype=np.int32),
            (np.arange(shape.tokens_per_sample) >= shape.tokens_per_sample // 2).astype(np.uint8),
            "synthetic.jsonl",
            i,
        )
        for i in range(count)
    ]
    lengths = np.full(count, shape.tokens_per_sample, dtype=np.int64)
    loss = np.array([int(s.loss_mask.sum()) for s in samples], dtype=np.int64)
    tasks = plan_lpt(lengths, n)
    order = [i for rows in tasks for i in rows]
    _write_samples(out / "samples.parquet", tasks, samples, lengths, loss)
    plan, pos = {"num_tasks": n, "tasks": []}, 0
    for t, rows in enumerate(tasks):
        plan["tasks"].append(
            {
                "task_id": t,
                "rows": list(range(pos, pos + len(rows))),
                "num_tokens": int(lengths[rows].sum()),
                "num_samples": len(rows),
            }
        )
        pos += len(rows)
    (out / "plan.json").write_text(json.dumps(plan) + "\n")
    summary = {"samples": len(order), "tokens": int(lengths.sum()), "tasks": {"num_tasks": n}}
    (out / "summary.json").write_text(json.dumps(summary) + "\n")


def _hidden(rng: np.random.Generator, tokens: int, layers: int, hidden: int) -> np.ndarray:
    import ml_dtypes

    return rng.standard_normal((tokens, layers, hidden), dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def _clone_task(run: Path, t: int, fate: str, template: int, shape: RunShape) -> None:
    """Task `t` as the task `template` of the same fate left it: its store copied, its state written by the
    attempt's own record (its last commit's report, then its end)."""
    from eagle_batch.launch import state as S
    from eagle_batch.launch.task import _AttemptRecord

    job = f"{FAKE_ARRAY_JOB}_{t}"
    log = run / S.SLURM_DIR / FAKE_ARRAY_JOB / f"{job}_0_log.err"
    log.write_text("")
    # Hard links: the same files and folders as a copy (what readers see), without copying the bytes.
    shutil.copytree(S.store_path(run, template), S.store_path(run, t), copy_function=os.link)
    src = S.read_state(run, template)
    record = _AttemptRecord(run, t, S.new_attempt(job, 0, str(log)))
    record.set_totals(src.samples_total, src.tokens_total)
    record.report(src.samples_committed, src.tokens_committed)  # as after its last commit
    if fate == "done":
        record.end(S.DONE, S.DONE)
    else:
        record.end("error", S.FAILED, "RuntimeError: a failure the scale benchmark injected")


def _one_task(cfg, run: Path, t: int, fate: str, spec, prepared, rng, shape: RunShape, count: bool) -> TaskWrites:
    from eagle_batch.launch import state as S
    from eagle_batch.launch.task import _AttemptRecord
    from eagle_batch.store import TaskStoreWriter

    writes = TaskWrites()
    job = f"{FAKE_ARRAY_JOB}_{t}"
    log = run / S.SLURM_DIR / FAKE_ARRAY_JOB / f"{job}_0_log.err"
    log.write_text("")
    samples = prepared.task_samples(t)
    record = _AttemptRecord(run, t, S.new_attempt(job, 0, str(log)))
    record.set_totals(len(samples), int(sum(len(s.input_ids) for s in samples)))
    per_commit = -(-len(samples) // shape.commits_per_task)
    with MetadataCalls() as calls:
        writer = TaskStoreWriter.open(S.store_path(run, t), spec, cfg.store, threads=1, on_commit=record.report)
    writes.open = calls.as_dict()
    try:
        for c in range(shape.commits_per_task):
            for s in samples[c * per_commit : (c + 1) * per_commit]:
                hs = _hidden(rng, len(s.input_ids), spec.num_layers, spec.hidden_size)
                writer.append(s.sample_id, s.input_ids, s.loss_mask, hs)
            with MetadataCalls() as calls:
                writer.commit()
            writes.commit.append(calls.as_dict())
            if fate == "failed":
                break
        with MetadataCalls() as calls:
            if fate == "done":
                writer.finalize()
            writer.close()
            if fate == "done":
                record.end(S.DONE, S.DONE)
            else:
                record.end("error", S.FAILED, "RuntimeError: a failure the scale benchmark injected")
        writes.finalize = calls.as_dict()
    finally:
        writer.close()
    return writes if count else TaskWrites()


def build_run(run_dir: str | Path, n: int, shape: RunShape | None = None, progress=None) -> dict:
    """Write a run of `n` tasks at `run_dir` (which must not exist); returns what was built: the task ids
    per fate, the first task's TaskWrites, files and bytes."""
    from eagle_batch.data import PreparedDataset
    from eagle_batch.launch import state as S
    from eagle_batch.launch.store_match import store_spec

    shape = shape or RunShape()
    run = Path(run_dir)
    if run.exists():
        raise FileExistsError(f"{run} exists; the scale benchmark builds its run in a new folder")
    rng = np.random.default_rng(shape.seed)
    pick = random.Random(shape.seed)
    cfg = _config(run, n, shape)
    _prepared(run, n, shape, rng)
    tasks = list(range(n))
    odd = pick.sample(tasks, max(2, round(n * (shape.failed_fraction + shape.missing_fraction))))
    failed = sorted(odd[: len(odd) // 2])
    missing = sorted(odd[len(odd) // 2 :])
    (run / S.SLURM_DIR / FAKE_ARRAY_JOB).mkdir(parents=True)
    S.append_submission(
        run,
        S.Submission(job_id=FAKE_ARRAY_JOB, executor="slurm", tasks=tasks, time=0.0, folder=str(run / S.SLURM_DIR)),
    )
    spec = store_spec(cfg)
    prepared = PreparedDataset(run)
    fates = dict.fromkeys(tasks, "done") | dict.fromkeys(failed, "failed") | dict.fromkeys(missing, "missing")
    first_done = next(t for t in tasks if fates[t] == "done")
    writes = TaskWrites()
    every = max(1, n // max(1, shape.written_stores))
    last_written: dict[str, int] = {}
    for t in progress(tasks) if progress else tasks:
        fate = fates[t]
        if fate == "missing":
            continue
        if fate in last_written and t % every:
            _clone_task(run, t, fate, last_written[fate], shape)
            continue
        w = _one_task(cfg, run, t, fate, spec, prepared, rng, shape, count=t == first_done)
        last_written[fate] = t
        if t == first_done:
            writes = w
    return {
        "tasks": n,
        "written_stores": len(
            {t for t in tasks if fates[t] != "missing" and not t % every} | set(last_written.values())
        ),
        "failed": failed,
        "missing": missing,
        "shape": asdict(shape),
        "task_writes": asdict(writes),
    }

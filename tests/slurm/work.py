"""Work functions of the tests (`extract.work=tests.slurm.work:NAME`, see eagle_batch/launch/work.py).

Faults are driven by files in RUN/faults/, so a test can arm and disarm them while jobs are queued
(environment variables are frozen at sbatch time):

    RUN/faults/raise-N       task N raises on every attempt (while the file exists)
    RUN/faults/sleep_s       seconds to sleep after each commit (default 0): lets a test act mid-way
    RUN/faults/sleep_s-N     the same for task N only (read on every sample)

`synthetic_work` writes deterministic pseudo hidden states through the real TaskStoreWriter (lock,
commit record, finalize), so duplicate/resume/identical-data checks exercise the real store without
loading a model; `slow_capture` is the real pipeline (prepared samples -> run_capture -> store) with
the same faults and delays.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from eagle_batch.launch.capture_work import capture_work
from eagle_batch.launch.state import store_path
from eagle_batch.launch.work import TaskContext

N_SAMPLES = 12
LAYERS = [1, 2]
HIDDEN = 16


def _faults(ctx: TaskContext) -> float:
    d = Path(ctx.run_dir) / "faults"
    if (d / f"raise-{ctx.task_id}").exists():
        raise RuntimeError(f"injected failure in task {ctx.task_id} (RUN/faults/raise-{ctx.task_id})")
    return _sleep_s(ctx)


def _sleep_s(ctx: TaskContext) -> float:
    """Read on every sample, so a test can speed a running task up. sleep_s-N overrides sleep_s for task N."""
    d = Path(ctx.run_dir) / "faults"
    for p in (d / f"sleep_s-{ctx.task_id}", d / "sleep_s"):
        try:
            return float(p.read_text())
        except (OSError, ValueError):
            continue
    return 0.0


def synthetic_sample(task_id: int, i: int):
    rng = np.random.default_rng(1000 * task_id + i)
    n = 8 + (7 * i + task_id) % 24
    ids = rng.integers(0, 1000, n, dtype=np.int32)
    mask = (np.arange(n) % 3 != 0).astype(np.uint8)
    # Positive finite bf16 bit patterns (exponent < 0xFF): verify rejects NaN/Inf.
    hs = rng.integers(0, 0x7F00, (n, len(LAYERS), HIDDEN), dtype=np.uint16)
    return f"t{task_id}-s{i}", ids, mask, hs


def synthetic_work(ctx: TaskContext) -> bool:
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    _faults(ctx)
    samples = [synthetic_sample(ctx.task_id, i) for i in range(N_SAMPLES)]
    ctx.set_totals(len(samples), sum(len(s[1]) for s in samples))
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN, model_name="synthetic")
    w = TaskStoreWriter.open(
        store_path(ctx.run_dir, ctx.task_id), spec, ctx.cfg.store, repair=ctx.repair, on_commit=ctx.report
    )
    try:
        done = set(w.committed_sample_ids)
        if w.is_complete:
            return True
        for sid, ids, mask, hs in samples:
            if sid in done:
                continue
            if ctx.should_stop():
                return False
            w.append(sid, ids, mask, hs)
            w.commit()
            time.sleep(_sleep_s(ctx))
        w.finalize()
        return True
    finally:
        w.close()


def slow_capture(ctx: TaskContext) -> bool:
    _faults(ctx)
    report = ctx.report

    def slow_report(samples: int, tokens: int) -> None:
        report(samples, tokens)
        time.sleep(_sleep_s(ctx))

    ctx.report = slow_report
    return capture_work(ctx)


def chained_probe(run_dir: str, out: str) -> dict:
    """A job chained with submit_after: records what it saw when it started (after aggregation)."""
    import json
    import time as _t

    from eagle_batch.launch.state import read_state

    run = Path(run_dir)
    n = json.loads((run / "prepared" / "plan.json").read_text())["num_tasks"]
    seen = {
        "time": _t.time(),
        "dataset_json": (run / "dataset.json").is_file(),
        "states": [getattr(read_state(run, t), "status", None) for t in range(n)],
    }
    Path(out).write_text(json.dumps(seen))
    return seen


def env_probe_work(ctx: TaskContext) -> bool:
    """synthetic_work, after recording the GPUs the task process was given (RUN/seen-T.json)."""
    import json
    import os

    seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_JOB_ID")}
    seen["pid"] = os.getpid()
    (Path(ctx.run_dir) / f"seen-{ctx.task_id}.json").write_text(json.dumps(seen))
    return synthetic_work(ctx)


def _engine_process() -> None:
    time.sleep(3600)


def engine_process_work(ctx: TaskContext) -> bool:
    """synthetic_work beside a process of its own, as vLLM's engine core and workers run beside a task: a
    task whose engine died cannot finish or commit its batch, so a dead helper fails the attempt."""
    import multiprocessing

    helper = multiprocessing.get_context("spawn").Process(target=_engine_process, daemon=True)
    helper.start()
    try:
        finished = synthetic_work(ctx)
        if helper.exitcode is not None:
            raise RuntimeError(f"the engine process of task {ctx.task_id} died (exit code {helper.exitcode})")
        return finished
    finally:
        helper.kill()


def block_work(ctx: TaskContext) -> bool:
    """The synthetic samples appended as the GPU capture path appends them: engine steps as append_block."""
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    samples = [synthetic_sample(ctx.task_id, i) for i in range(N_SAMPLES)]
    ctx.set_totals(len(samples), sum(len(s[1]) for s in samples))
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN, model_name="synthetic")
    w = TaskStoreWriter.open(store_path(ctx.run_dir, ctx.task_id), spec, ctx.cfg.store, on_commit=ctx.report)
    try:
        for k in range(0, len(samples), 4):  # 4 samples per "engine step", one commit per step
            step = samples[k : k + 4]
            w.append_block(
                [s[0] for s in step], [s[1] for s in step], [s[2] for s in step], np.concatenate([s[3] for s in step])
            )
            w.commit()
        w.finalize()
        return True
    finally:
        w.close()


def empty_work(ctx: TaskContext) -> bool:
    """A task whose share of the plan is empty: a finalized store with no sample."""
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    ctx.set_totals(0, 0)
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN, model_name="synthetic")
    w = TaskStoreWriter.open(store_path(ctx.run_dir, ctx.task_id), spec, ctx.cfg.store, on_commit=ctx.report)
    try:
        w.finalize()
        return True
    finally:
        w.close()

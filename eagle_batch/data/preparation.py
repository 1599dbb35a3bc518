"""The prepare stage: dataset files -> RUN/prepared/{samples.parquet, plan.json, summary.json, bad_rows.jsonl}.

    summary = prepare(cfg, workers=2)

Rows are read in the main process (JSON Lines stay raw bytes), then decoded, normalized, rendered with
the chat template and tokenized in chunks, in worker processes when workers > 1. Results come back in
input order (imap), so the output does not depend on the worker count. Deduplication, the shard plan
and all writing happen in the main process. The output folder is built next to RUN/prepared and
swapped in at the end, so a failed or interrupted prepare never leaves a half-written dataset.

Memory: every kept sample is held until the plan is made (5 bytes per token: int32 id + uint8 mask),
e.g. ~0.2 GB for the 44M-token benchmark and ~10 GB for 2B tokens. Runs far beyond that need a spill
to disk before planning (not implemented).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from eagle_batch.config import ConfigError, RunConfig, check_fits_model, check_values, model_info, save_config
from eagle_batch.ownership import make_run_dir

from .dataset import BAD_ROWS, PLAN, PREPARED, SAMPLES, SUMMARY
from .plan import plan_lpt
from .readers import JSONL_SUFFIXES, RawRecord, count_rows, iter_records, resolve_inputs
from .rows import DataView, init_worker, load_tokenizer, process_chunk
from .streaming import ReadLimits
from .tally import BadRowError, NothingToPrepare, Sample, Tally  # noqa: F401 - the errors prepare raises

CHUNK_ROWS = 256


def _chunks(records: Iterable[RawRecord], n: int) -> Iterator[list[RawRecord]]:
    buf: list[RawRecord] = []
    for r in records:
        buf.append(r)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf


class Progress:
    """A plain-stderr progress line: redrawn in place on a terminal, one line every 10 s in logs."""

    def __init__(
        self, total: int | None, enabled: bool = True, stream=None, total_bytes: int | None = None, bytes_done=None
    ):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.total = total
        # JSON Lines have no cheap row count: show the fraction of bytes read instead.
        self.total_bytes = total_bytes
        self.bytes_done = bytes_done
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.monotonic()
        self.last = self.t0

    def update(self, rows: int, samples: int, tokens: int, bad: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < (0.5 if self.tty else 10.0):
            return
        self.last = now
        el = max(now - self.t0, 1e-9)
        if self.total:
            frac = min(rows / self.total, 1.0)
            bar = "#" * int(frac * 24)
            head = f"[{bar:<24}] {frac:6.1%} {rows}/{self.total} rows"
        elif self.total_bytes and self.bytes_done is not None:
            frac = min(self.bytes_done() / self.total_bytes, 1.0)
            head = f"[{'#' * int(frac * 24):<24}] {frac:6.1%} of input read, {rows} rows"
        else:
            head = f"{rows} rows"
        line = (
            f"prepare: {head}, {samples} samples, {tokens / 1e6:.2f}M tokens, {bad} skipped, "
            f"{rows / el:,.0f} rows/s, {tokens / el:,.0f} tok/s"
        )
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K" + ("\n" if force else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _percentiles(lengths: np.ndarray) -> dict:
    if lengths.size == 0:
        return {}
    q = np.percentile(lengths, [0, 50, 90, 99, 100])
    return {
        "min": int(q[0]),
        "p50": float(q[1]),
        "p90": float(q[2]),
        "p99": float(q[3]),
        "max": int(q[4]),
        "mean": float(lengths.mean()),
    }


def _check_run_dir(cfg: RunConfig, force: bool) -> Path:
    """Refuse to re-prepare a run whose stores hold committed samples (re-planning would give the tasks other
    samples); stores an attempt created but never committed to (an engine that failed to start) hold nothing
    and are removed."""
    from eagle_batch.store.record import committed_samples

    run_dir = Path(cfg.run_dir)
    stores = sorted((run_dir / "stores").glob("task-*.zarr")) if (run_dir / "stores").is_dir() else []
    holding = [p for p in stores if committed_samples(p) > 0]
    if holding and not force:
        raise ConfigError(
            f"{run_dir} already has extracted stores ({len(holding)} with committed samples); re-preparing would "
            "change which samples each task holds. Use a new run_dir, or pass --force if you really want to "
            "replace the prepared data (then delete the stores)."
        )
    for p in stores:
        if p not in holding:
            shutil.rmtree(p)
    return run_dir


def prepare(cfg: RunConfig, workers: int = 1, progress: bool = True, force: bool = False, tokenizer=None) -> dict:
    """Run the prepare stage for `cfg`; returns the summary (also written to RUN/prepared/summary.json)."""
    from dataclasses import asdict

    t0 = time.monotonic()
    d = cfg.data
    # The checks extract repeats before submitting, so that a run fails here, not hours later in its tasks:
    # values (lengths against model.max_model_len, enums) and, when the model folder is here, its layer ids.
    check_values(cfg)
    if (Path(cfg.model.path) / "config.json").is_file():
        check_fits_model(cfg, model_info(cfg.model.path))
    # Inputs (every file there and, for Parquet/Arrow, readable) and the tokenizer before the run directory:
    # a bad input fails before anything in RUN is touched (_check_run_dir removes never-committed stores).
    files = resolve_inputs(list(d.inputs))
    tok = tokenizer if tokenizer is not None else load_tokenizer(cfg)
    run_dir = _check_run_dir(cfg, force)
    cfg_dict = asdict(cfg)

    counts = [count_rows(f) for f in files]
    total = sum(counts) if all(c is not None for c in counts) else None
    if total is not None and d.limit:
        total = min(total, d.limit)

    tmp_dir = run_dir / f".{PREPARED}.tmp-{os.getpid()}"
    try:
        make_run_dir(run_dir)  # group/other read-only whatever the umask: RUN holds the run's control plane
        shutil.rmtree(tmp_dir, ignore_errors=True)
        tmp_dir.mkdir()
    except OSError as e:
        raise ConfigError(
            f"run_dir={run_dir}: cannot create {e.filename or run_dir} ({e.strerror}); choose a "
            "folder you can write to."
        ) from None
    t_start = time.monotonic()
    try:
        summary = _prepare_into(cfg, cfg_dict, tok, files, total, tmp_dir, workers, progress)
        now = time.monotonic()
        summary["elapsed_s"] = round(now - t0, 3)
        # Rates over the processing only: tokenizer loading (seconds of imports) is a fixed cost.
        summary["process_s"] = round(now - t_start, 3)
        summary["rows_per_s"] = round(summary["rows_read"] / max(summary["process_s"], 1e-9), 1)
        summary["tokens_per_s"] = round(summary["tokens"] / max(summary["process_s"], 1e-9), 1)
        (tmp_dir / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
        final = run_dir / PREPARED
        old = run_dir / f".{PREPARED}.old-{os.getpid()}"
        if final.exists():
            os.rename(final, old)
        os.rename(tmp_dir, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    save_config(cfg, run_dir)
    return summary


def _prepare_into(
    cfg: RunConfig,
    cfg_dict: dict,
    tok,
    files: list[Path],
    total: int | None,
    out: Path,
    workers: int,
    show_progress: bool,
) -> dict:
    d = cfg.data
    consumed = [0]  # bytes of JSON Lines handed to the workers (progress for text inputs)
    text_bytes = (
        sum(f.stat().st_size for f in files)
        if total is None and not d.limit and all(f.name.endswith(JSONL_SUFFIXES) for f in files)
        else None
    )
    prog = Progress(total, enabled=show_progress, total_bytes=text_bytes, bytes_done=lambda: consumed[0])
    with (
        open(out / BAD_ROWS, "w") as bad_f,
        _row_results(cfg_dict, tok, _records(files, d.limit, consumed, ReadLimits.from_config(d)), workers) as results,
    ):
        tally = Tally(DataView(cfg_dict["data"]), bad_f, [str(f) for f in files])
        for chunk in results:
            for res in chunk:
                tally.add(res)
            prog.update(tally.rows_read, len(tally.samples), tally.tokens, sum(tally.skipped.values()))
    prog.update(tally.rows_read, len(tally.samples), tally.tokens, sum(tally.skipped.values()), force=True)
    if not tally.samples:
        raise tally.nothing_kept(len(files))
    return _write_plan(cfg, files, tally, out)


def _records(files: list[Path], limit: int, consumed: list[int], limits: ReadLimits) -> Iterator[RawRecord]:
    n = 0
    for f in files:
        for rec in iter_records(f, limits):
            if limit and n >= limit:
                return
            n += 1
            if rec.raw is not None:
                consumed[0] += len(rec.raw)
            yield rec


@contextlib.contextmanager
def _row_results(cfg_dict: dict, tok, records: Iterator[RawRecord], workers: int) -> Iterator[Iterator[list]]:
    """RowResults of `records` in input order, chunk by chunk, from `workers` processes (or this one)."""
    init_worker(cfg_dict["model"], cfg_dict["data"], tokenizer=tok)
    if workers <= 1:
        yield map(process_chunk, _chunks(records, CHUNK_ROWS))
        return
    if "fork" in mp.get_all_start_methods():
        # Forked workers inherit the loaded tokenizer: no per-worker import of transformers (tens of
        # seconds on a busy node). Safe because the tokenizer's Rust thread pool is off
        # (TOKENIZERS_PARALLELISM=false, set before loading); if a user turned it on, the tokenizers
        # library notices the fork and disables it in the children.
        pool = mp.get_context("fork").Pool(workers)
    else:
        pool = mp.get_context("spawn").Pool(
            workers, initializer=init_worker, initargs=(cfg_dict["model"], cfg_dict["data"])
        )
    try:
        yield pool.imap(process_chunk, _chunks(records, CHUNK_ROWS), chunksize=1)
    finally:
        pool.terminate()
        pool.join()


def _write_plan(cfg: RunConfig, files: list[Path], tally: Tally, out: Path) -> dict:
    """samples.parquet and plan.json for the kept samples; returns the summary."""
    samples = tally.samples
    lengths = np.fromiter((len(s.input_ids) for s in samples), dtype=np.int64, count=len(samples))
    loss = np.fromiter((int(s.loss_mask.sum()) for s in samples), dtype=np.int64, count=len(samples))
    num_tasks = cfg.extract.num_tasks
    if num_tasks > len(samples):  # a task without samples would run an engine for nothing
        raise ConfigError(
            f"extract.num_tasks={num_tasks}: {num_tasks} tasks for {len(samples)} samples; set extract.num_tasks "
            f"<= {len(samples)}. Nothing was written."
        )
    tasks = plan_lpt(lengths, num_tasks)
    _write_samples(out / SAMPLES, tasks, samples, lengths, loss)
    plan = {"num_tasks": num_tasks, "tasks": []}
    pos = 0
    task_tokens = []
    for t, rows in enumerate(tasks):
        ntok = int(lengths[rows].sum()) if rows else 0
        task_tokens.append(ntok)
        plan["tasks"].append(
            {"task_id": t, "rows": list(range(pos, pos + len(rows))), "num_tokens": ntok, "num_samples": len(rows)}
        )
        pos += len(rows)
    assert pos == len(samples)
    (out / PLAN).write_text(json.dumps(plan) + "\n")
    mean_task = (sum(task_tokens) / num_tasks) if num_tasks else 0
    return {
        "inputs": [str(f) for f in files],
        "tokenizer": str(cfg.model.tokenizer or cfg.model.path),
        "rows_read": tally.rows_read,
        "rows_kept": tally.rows_kept,
        "rows_skipped": sum(tally.skipped.values()),
        "skipped_by_reason": dict(sorted(tally.skipped.items())),
        "samples": len(samples),
        "samples_dropped_by_reason": dict(sorted(tally.dropped.items())),
        "samples_truncated": tally.truncated,
        # assistant (loss-carrying) tokens past data.max_length in those samples: cut, never trained on
        "truncated_loss_tokens": tally.loss_tokens_cut,
        "max_length": cfg.data.max_length,
        "rows_split_per_turn": tally.split_rows,
        # Rows whose assistant turns carry fields the chat template does not render (not trained on).
        "rows_with_unrendered_fields": dict(sorted(tally.unrendered.items())),
        # Assistant turns that render to nothing but end-of-turn markers (data.empty_assistant_turns=mask).
        "empty_assistant_turns_masked": tally.empty_turns_masked,
        "assistant_turns_not_trained": tally.turns_untrained,
        "file_warnings": tally.file_warnings(),
        "files": {
            name: {
                "rows": ft.rows,
                "kept": ft.kept,
                "skipped": dict(sorted(ft.skipped.items())),
                "read_as": dict(sorted(ft.formats.items())),  # rows read as each format
            }
            for name, ft in tally.files.items()
        },
        "tokens": int(lengths.sum()),
        "loss_tokens": int(loss.sum()),
        "loss_token_fraction": round(float(loss.sum() / max(lengths.sum(), 1)), 6),
        "length_percentiles": _percentiles(lengths),
        "tasks": {
            "num_tasks": num_tasks,
            "min_tokens": min(task_tokens),
            "max_tokens": max(task_tokens),
            "max_over_mean": round(max(task_tokens) / mean_task, 4) if mean_task else None,
            "empty_tasks": sum(1 for r in tasks if not r),
        },
    }


def _write_samples(path: Path, tasks, samples: list[Sample], lengths, loss) -> None:
    """samples.parquet in plan order; each task's rows in their own row groups (cheap per-task reads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("sample_id", pa.string()),
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.uint8())),
            ("num_tokens", pa.int32()),
            ("num_loss_tokens", pa.int32()),
            ("source_file", pa.string()),
            ("source_row", pa.int64()),
        ]
    )

    def list_array(arrays, dtype, pa_type):
        offsets = np.zeros(len(arrays) + 1, dtype=np.int32 if lengths.sum() < 2**31 else np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        values = np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)
        off_type = pa.int32() if offsets.dtype == np.int32 else pa.int64()
        cls = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
        arr = cls.from_arrays(pa.array(offsets, type=off_type), pa.array(values, type=pa_type))
        return arr.cast(pa.list_(pa_type)) if cls is pa.LargeListArray else arr

    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        if not any(tasks):
            w.write_table(schema.empty_table())
        for rows in tasks:
            if not rows:
                continue
            table = pa.Table.from_arrays(
                [
                    pa.array([samples[i].sample_id for i in rows], pa.string()),
                    list_array([samples[i].input_ids for i in rows], np.int32, pa.int32()),
                    list_array([samples[i].loss_mask for i in rows], np.uint8, pa.uint8()),
                    pa.array(lengths[rows].astype(np.int32)),
                    pa.array(loss[rows].astype(np.int32)),
                    pa.array([samples[i].file for i in rows], pa.string()),
                    pa.array(np.asarray([samples[i].row for i in rows], dtype=np.int64)),
                ],
                schema=schema,
            )
            w.write_table(table, row_group_size=8192)

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
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eagle_batch import environment
from eagle_batch.config import ConfigError, RunConfig, check_fits_model, check_values, model_info, save_config

from .dataset import BAD_ROWS, PLAN, PREPARED, SAMPLES, SUMMARY
from .formats import BadRow, row_to_conversation
from .plan import plan_lpt
from .readers import JSONL_SUFFIXES, RawRecord, count_rows, decode_record, iter_records, resolve_inputs
from .tally import BadRowError, NothingToPrepare, Sample, Tally  # noqa: F401 - the errors prepare raises
from .template import (
    EmptyAssistantTurn,
    TemplateError,
    TemplateNotPrefixStable,
    render_samples,
    template_info,
    tokenize_rendered,
)

CHUNK_ROWS = 256


def load_tokenizer(cfg: RunConfig):
    """The run's tokenizer (model.tokenizer or model.path) with model.chat_template applied if set."""
    return load_tokenizer_from(
        cfg.model.tokenizer or cfg.model.path, cfg.model.chat_template, cfg.model.trust_remote_code
    )


def load_tokenizer_from(src: str, chat_template: str = "", trust_remote_code: bool = False):
    environment.set_offline_defaults()
    from transformers import AutoTokenizer

    if not src or not Path(src).is_dir():
        raise ConfigError(
            f"model.path / model.tokenizer = {src!r} is not a local folder; point it at a "
            "Hugging Face model or tokenizer folder (nothing is downloaded)."
        )
    tok = AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code)
    if chat_template:
        p = Path(chat_template)
        if not p.is_file():
            raise ConfigError(f"model.chat_template={p}: no such file; give a Jinja template file or leave it empty.")
        tok.chat_template = p.read_text()
    if not getattr(tok, "chat_template", None):
        raise ConfigError(f"the tokenizer in {src} has no chat template; set model.chat_template to a Jinja file.")
    return tok


def sample_id(ids: np.ndarray, mask: np.ndarray) -> str:
    """Content hash of the tokenized sample: the same conversation always gets the same id."""
    h = hashlib.blake2b(ids.astype(np.int32, copy=False).tobytes(), digest_size=10)
    h.update(mask.astype(np.uint8, copy=False).tobytes())
    return h.hexdigest()


@dataclass
class RowResult:
    file: str
    index: int
    line_kind: str
    bad: tuple[str, str] | None = None
    samples: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)  # (id, ids, mask)
    dropped: list[str] = field(default_factory=list)  # per-sample drop reasons
    truncated: int = 0
    split: bool = False  # the template was not prefix-stable: more than one sample for this row
    unrendered: tuple[str, ...] = ()  # message fields the template left out (e.g. reasoning in ChatML)
    empty_turns_masked: int = 0  # assistant turns left out of the loss for rendering empty
    keys: tuple[str, ...] = ()  # the row's fields, when it was skipped for its shape (what the file holds)


# Worker state (set once per process by _init_worker; the main process uses it too when workers=1).
_W: dict[str, Any] = {}


def _init_worker(model: dict, data: dict, tokenizer=None) -> None:
    _W["tok"] = (
        tokenizer
        if tokenizer is not None
        else load_tokenizer_from(
            model["tokenizer"] or model["path"], model["chat_template"], model["trust_remote_code"]
        )
    )
    _W["data"] = _DataView(data)


class _DataView:
    """Attribute access to the data section (picklable, no omegaconf in the hot loop)."""

    def __init__(self, d: dict):
        self.__dict__.update(d)


def process_chunk(records: list[RawRecord]) -> list[RowResult]:
    tok, data = _W["tok"], _W["data"]
    kwargs = dict(data.chat_template_kwargs or {})
    results: list[RowResult] = []
    rendered_all = []  # (result index, RenderedSample)
    for rec in records:
        res = RowResult(rec.file, rec.index, rec.line_kind)
        results.append(res)
        row = None
        try:
            row = decode_record(rec)
            messages, tools = row_to_conversation(row, data)
            kw = dict(kwargs, tools=tools) if tools else kwargs
            rendered = render_samples(
                tok, messages, non_prefix_stable=data.non_prefix_stable, empty_turns=data.empty_assistant_turns, **kw
            )
        except BadRow as e:
            res.bad = (e.reason, e.detail)
            if isinstance(row, dict):
                res.keys = tuple(sorted(str(k) for k in row)[:40])
            continue
        except TemplateNotPrefixStable as e:
            res.bad = ("not_prefix_stable", str(e))
            continue
        except EmptyAssistantTurn as e:
            res.bad = ("empty_assistant_turn", str(e))
            continue
        except TemplateError as e:
            res.bad = ("template_error", str(e))
            continue
        except ValueError as e:  # render_samples: no trainable assistant turn (e.g. only at position 0)
            res.bad = ("no_assistant_turn", str(e))
            continue
        res.split = len(rendered) > 1
        res.unrendered = _unrendered_fields(messages, rendered)
        trained = {t for r in rendered for t in r.turns}
        res.empty_turns_masked = sum(
            1 for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0 and i not in trained
        )
        rendered_all.extend((len(results) - 1, r) for r in rendered)
    if rendered_all:
        info = template_info(tok, **kwargs)
        encoded = tokenize_rendered(tok, [r for _, r in rendered_all], info)
        for (ri, _), (ids, mask) in zip(rendered_all, encoded):
            res = results[ri]
            if data.max_length and len(ids) > data.max_length:
                ids, mask = ids[: data.max_length], mask[: data.max_length]
                res.truncated += 1
            if int(mask.sum()) < max(1, data.min_loss_tokens):
                res.dropped.append("too_few_loss_tokens")
                continue
            res.samples.append((sample_id(ids, mask), ids, mask))
    return results


def _unrendered_fields(messages: list[dict], rendered) -> tuple[str, ...]:
    """Fields present in the data that the chat template does not write (so they are not trained on).

    Not an error: many templates ignore reasoning or tool calls, but the summary should say so.
    """
    text = "".join(r.text for r in rendered)
    missing = set()
    for m in messages:
        if m["role"] != "assistant":
            continue
        reasoning = m.get("reasoning_content")
        if reasoning and reasoning.strip() not in text:
            missing.add("reasoning_content")
        for call in m.get("tool_calls") or ():
            if call["function"]["name"] not in text:
                missing.add("tool_calls")
    return tuple(sorted(missing))


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
    run_dir = Path(cfg.run_dir)
    stores = run_dir / "stores"
    if stores.is_dir() and any(stores.iterdir()) and not force:
        raise ConfigError(
            f"{run_dir} already has extracted stores; re-preparing would change which samples "
            "each task holds. Use a new run_dir, or pass --force if you really want to replace "
            "the prepared data (then delete the stores)."
        )
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
    run_dir = _check_run_dir(cfg, force)
    files = resolve_inputs(list(d.inputs))
    tok = tokenizer if tokenizer is not None else load_tokenizer(cfg)
    cfg_dict = asdict(cfg)

    counts = [count_rows(f) for f in files]
    total = sum(counts) if all(c is not None for c in counts) else None
    if total is not None and d.limit:
        total = min(total, d.limit)

    tmp_dir = run_dir / f".{PREPARED}.tmp-{os.getpid()}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
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
        _row_results(cfg_dict, tok, _records(files, d.limit, consumed), workers) as results,
    ):
        tally = Tally(_DataView(cfg_dict["data"]), bad_f, [str(f) for f in files])
        for chunk in results:
            for res in chunk:
                tally.add(res)
            prog.update(tally.rows_read, len(tally.samples), tally.tokens, sum(tally.skipped.values()))
    prog.update(tally.rows_read, len(tally.samples), tally.tokens, sum(tally.skipped.values()), force=True)
    if not tally.samples:
        raise tally.nothing_kept(len(files))
    return _write_plan(cfg, files, tally, out)


def _records(files: list[Path], limit: int, consumed: list[int]) -> Iterator[RawRecord]:
    n = 0
    for f in files:
        for rec in iter_records(f):
            if limit and n >= limit:
                return
            n += 1
            if rec.raw is not None:
                consumed[0] += len(rec.raw)
            yield rec


@contextlib.contextmanager
def _row_results(cfg_dict: dict, tok, records: Iterator[RawRecord], workers: int) -> Iterator[Iterator[list]]:
    """RowResults of `records` in input order, chunk by chunk, from `workers` processes (or this one)."""
    _init_worker(cfg_dict["model"], cfg_dict["data"], tokenizer=tok)
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
            workers, initializer=_init_worker, initargs=(cfg_dict["model"], cfg_dict["data"])
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
        "rows_split_per_turn": tally.split_rows,
        # Rows whose assistant turns carry fields the chat template does not render (not trained on).
        "rows_with_unrendered_fields": dict(sorted(tally.unrendered.items())),
        # Assistant turns that render to nothing but end-of-turn markers (data.empty_assistant_turns=mask).
        "empty_assistant_turns_masked": tally.empty_turns_masked,
        "file_warnings": tally.file_warnings(),
        "files": {
            name: {"rows": ft.rows, "kept": ft.kept, "skipped": dict(sorted(ft.skipped.items()))}
            for name, ft in tally.files.items()
        },
        "tokens": int(lengths.sum()),
        "loss_tokens": int(loss.sum()),
        "masked_fraction": round(float(loss.sum() / max(lengths.sum(), 1)), 6),
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

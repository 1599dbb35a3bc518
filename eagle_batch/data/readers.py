"""Read dataset files into raw records, keeping the file and line/row of each for error reports.

Supported: JSON Lines (.jsonl, .ndjson), JSON (.json: a list of objects, or JSON Lines misnamed .json),
CSV and TSV with a header row (.csv, .tsv: one column per field, a conversation column as a JSON string;
an empty cell is a missing value), each of those gzip-compressed too (.jsonl.gz, ...), Parquet (.parquet),
Arrow IPC file or stream (.arrow, .feather, .ipc), and folders written by `datasets.save_to_disk` (Dataset
or DatasetDict, read from their Arrow files with pyarrow so the `datasets` package is not needed). Inputs
may be files, folders or glob patterns.

JSON Lines records stay raw bytes here: decoding and parsing happen in the worker processes, which
also turns undecodable bytes and invalid JSON into counted bad rows. A UTF-8 byte order mark at the start
of a text file is skipped (Windows tools write one), as Python's utf-8-sig codec does.

A columnar file (Parquet, Arrow) that cannot be opened at all is not a bad row but a bad input: there are
no rows to count. `resolve_inputs` opens each one's footer or schema (cheap) and raises
`UnreadableInputError` naming the file, before any work, as it does for a missing file; a file that opens
but is damaged further in raises the same error when its rows are read.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle_batch.config import ConfigError

from .records import RawRecord, ReadProblem, json_error_detail
from .streaming import (
    DEFAULT_LIMITS,
    CappedReader,
    FileTooLarge,
    ReadLimits,
    iter_csv,
    iter_json,
    iter_jsonl,
    too_large_problem,
    too_long_problem,
)

JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
CSV_SUFFIXES = (".csv", ".tsv")
TEXT_SUFFIXES = JSONL_SUFFIXES + JSON_SUFFIXES + CSV_SUFFIXES
GZIP_SUFFIX = ".gz"  # text files may be gzip-compressed
SUPPORTED = TEXT_SUFFIXES + tuple(x + GZIP_SUFFIX for x in TEXT_SUFFIXES) + PARQUET_SUFFIXES + ARROW_SUFFIXES


class UnreadableInputError(ConfigError):
    """An input file that cannot be read at all (not Parquet/Arrow inside, a damaged datasets folder)."""


def _unreadable(path: Path, kind: str, e: BaseException, rows_read: int | None = None) -> UnreadableInputError:
    detail = str(e).splitlines()[0] if str(e) else type(e).__name__
    after = f", after {rows_read} row(s)" if rows_read is not None else ""
    return UnreadableInputError(
        f"data.inputs: {path} is not a readable {kind} file ({detail}{after}); re-download or re-convert "
        "it, or remove it from data.inputs."
    )


def _is_datasets_folder(p: Path) -> bool:
    return (p / "state.json").is_file() or (p / "dataset_dict.json").is_file()


def _datasets_folder_files(p: Path) -> list[Path]:
    meta = p / ("dataset_dict.json" if (p / "dataset_dict.json").is_file() else "state.json")
    try:
        if meta.name == "dataset_dict.json":  # DatasetDict: every split, in the order it lists them
            splits = json.loads(meta.read_text()).get("splits", [])
            return [f for s in splits for f in _datasets_folder_files(p / s)]
        files = [p / d["filename"] for d in json.loads(meta.read_text()).get("_data_files", [])]
    except FileNotFoundError as e:  # a split folder the dict lists is gone
        raise UnreadableInputError(
            f"data.inputs: {meta} lists {e.filename}, which does not exist; the datasets folder is "
            "incomplete: save it again (save_to_disk) or remove it from data.inputs."
        ) from None
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise UnreadableInputError(
            f"data.inputs: {meta} is damaged ({type(e).__name__}: {e}); save the dataset again "
            "(save_to_disk) or remove the folder from data.inputs."
        ) from None
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise UnreadableInputError(
            f"data.inputs: {meta} lists {missing[0]}, which does not exist; the datasets folder is "
            "incomplete: save it again (save_to_disk) or remove it from data.inputs."
        )
    return files


def resolve_inputs(inputs: list[str]) -> list[Path]:
    """Expand files / folders / globs into an ordered list of data files; ConfigError if none."""
    if not inputs:
        raise ConfigError(
            "data.inputs is empty; give JSONL/Parquet/Arrow files, folders or globs, e.g. data.inputs=[data/chat.jsonl]"
        )
    files: list[Path] = []
    for spec in inputs:
        matches = (
            sorted(glob.glob(os.path.expanduser(spec), recursive=True))
            if glob.has_magic(spec)
            else [os.path.expanduser(spec)]
        )
        if not matches or not all(os.path.exists(m) for m in matches):
            raise ConfigError(
                f"data.inputs entry {spec!r} matches no file; check the path (relative paths "
                f"are resolved from {os.getcwd()})."
            )
        for m in matches:
            p = Path(m)
            if p.is_dir():
                if _is_datasets_folder(p):
                    files.extend(_datasets_folder_files(p))
                else:
                    found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(SUPPORTED))
                    if not found:
                        raise ConfigError(
                            f"folder {p} has no {', '.join(SUPPORTED)} files and is not a datasets.save_to_disk "
                            f"folder{_subfolder_hint(p)}."
                        )
                    files.extend(found)
            elif p.name.endswith(SUPPORTED):
                files.append(p)
            else:
                raise ConfigError(f"{p}: unsupported file type; use one of {', '.join(SUPPORTED)}.")
    for f in files:  # before any row is read: one unreadable file fails the run, as a missing one does
        check_readable(f)
    return files


def _text_name(path: Path) -> str:
    """The file name without a .gz suffix: what decides how its text is read."""
    return path.name[: -len(GZIP_SUFFIX)] if path.name.endswith(GZIP_SUFFIX) else path.name


def _open_bytes(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(GZIP_SUFFIX) else open(path, "rb")


def _subfolder_hint(folder: Path) -> str:
    """'; its subfolders hold ...' when data files lie deeper (a Hugging Face dataset download keeps them in
    data/). Folders are not searched recursively: a download's other splits (test, validation) would join."""
    deeper = sorted(
        f.relative_to(folder)
        for f in folder.rglob("*")
        if f.is_file()
        and f.name.endswith(SUPPORTED)
        and not any(x.startswith(".") for x in f.relative_to(folder).parts)
    )
    if not deeper:
        return ""
    shown = ", ".join(str(f) for f in deeper[:4]) + (f" and {len(deeper) - 4} more" if len(deeper) > 4 else "")
    first = next((f for f in deeper if f.name.startswith("train")), deeper[0])
    pattern = ("train*" if first.name.startswith("train") else "*") + first.suffix
    return (
        f"; its subfolders hold {len(deeper)} data file(s) ({shown}): name the ones to read, e.g. "
        f"data.inputs=[{folder / first.parent}] or a glob such as {folder / first.parent / pattern}"
    )


def check_readable(path: Path) -> None:
    """UnreadableInputError unless a columnar file's footer (Parquet) or schema (Arrow) can be read, or a
    .gz file starts as gzip; text files have nothing more to check here (their bad lines are bad rows)."""
    import pyarrow as pa

    if path.name.endswith(GZIP_SUFFIX):
        try:
            with gzip.open(path, "rb") as f:
                f.read(1)
        except (OSError, EOFError) as e:
            raise _unreadable(path, "gzip", e) from None
    elif path.name.endswith(PARQUET_SUFFIXES):
        import pyarrow.parquet as pq

        try:
            pq.ParquetFile(path).close()
        except (pa.ArrowException, OSError) as e:
            raise _unreadable(path, "Parquet", e) from None
    elif path.name.endswith(ARROW_SUFFIXES):
        try:
            _arrow_reader(path, schema_only=True)
        except (pa.ArrowException, OSError) as e:
            raise _unreadable(path, "Arrow IPC", e) from None


def count_rows(path: Path) -> int | None:
    """Row count when cheap (columnar metadata); None for text files."""
    try:
        if path.name.endswith(PARQUET_SUFFIXES):
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return None
    return None


def _arrow_reader(path: Path, schema_only: bool = False):
    """The file's table (or, with `schema_only`, just its schema: a cheap check that it opens)."""
    import pyarrow as pa

    # datasets writes the IPC *stream* format; Feather v2 / .arrow files are the IPC *file* format.
    with pa.memory_map(str(path)) as source:
        try:
            r = pa.ipc.open_file(source)
            return r.schema if schema_only else r.read_all()
        except pa.ArrowInvalid:
            pass
    with pa.memory_map(str(path)) as source:
        r = pa.ipc.open_stream(source)
        return r.schema if schema_only else r.read_all()


def iter_records(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[RawRecord]:
    """The records of one input, read as a stream with at most one record of `limits.max_row_bytes` in
    memory (data/streaming.py); what cannot be read as a record is a record holding a ReadProblem."""
    name = _text_name(path)
    if not name.endswith(TEXT_SUFFIXES):
        yield from _iter_columnar(path, limits)
        return
    rows = 0
    try:  # a gzip stream cut off or damaged part-way: the rows before it were read, the rest cannot be found
        with _open_bytes(path) as raw:
            f = CappedReader(raw, limits.max_decompressed_bytes if path.name.endswith(GZIP_SUFFIX) else 0)
            if name.endswith(JSONL_SUFFIXES):
                records = iter_jsonl(f, str(path), limits)
            elif name.endswith(CSV_SUFFIXES):
                records = iter_csv(f, str(path), name.endswith(".tsv"), limits)
            else:
                records = iter_json(f, str(path), limits)
            for rec in records:
                rows += 1
                yield rec
    except FileTooLarge:
        yield RawRecord(str(path), rows, "row", row=too_large_problem(limits))
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise _unreadable(path, "gzip", e, rows_read=rows) from None


def _iter_columnar(path: Path, limits: ReadLimits) -> Iterator[RawRecord]:
    """Rows of a Parquet or Arrow file. Damage past the footer/schema (a bad page or record batch) stops the
    run with UnreadableInputError: the rows after it cannot be found, so they cannot be counted either. A row
    whose strings pass `max_row_bytes` is a `row_too_long` row (Arrow has read its batch already: the cap
    keeps it from the tokenizer; the batches themselves are what the file's writer made them)."""
    import pyarrow as pa

    name = str(path)
    parquet = path.name.endswith(PARQUET_SUFFIXES)
    i = 0
    try:
        if parquet:
            import pyarrow.parquet as pq

            batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
        else:
            batches = _arrow_reader(path).to_batches(max_chunksize=1024)
        for batch in batches:
            sizes = _row_sizes(batch)
            for row, size in zip(batch.to_pylist(), sizes):
                if limits.max_row_bytes and size > limits.max_row_bytes:
                    row = too_long_problem(f"row {i}", size, limits)
                yield RawRecord(name, i, "row", row=row)
                i += 1
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(path, "Parquet" if parquet else "Arrow IPC", e, rows_read=i) from None


def _row_sizes(batch) -> list[int]:
    """Bytes of each row's string and binary values (nested lists and structs included), from the Arrow
    buffers' offsets: no row is turned into Python objects to be measured."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = pa.array([0] * batch.num_rows, pa.int64())
    for column in batch.columns:
        total = pc.add(total, _value_bytes(column))
    return total.to_pylist()


def _value_bytes(arr):
    import pyarrow as pa
    import pyarrow.compute as pc

    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pc.fill_null(pc.binary_length(arr), 0).cast(pa.int64())
    if pa.types.is_struct(t):
        out = pa.array([0] * len(arr), pa.int64())
        for k in range(t.num_fields):
            out = pc.add(out, _value_bytes(pc.struct_field(arr, [k])))
        return out
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _value_bytes(pc.list_flatten(arr))
        parents = pc.list_parent_indices(arr)
        sums = [0] * len(arr)
        for p, v in zip(parents.to_pylist(), inner.to_pylist()):
            sums[p] += v
        return pa.array(sums, pa.int64())
    return pa.array([0] * len(arr), pa.int64())


def decode_record(rec: RawRecord) -> Any:
    """The row of a record, decoding JSON Lines bytes here; BadRow for what cannot be read."""
    from .formats import BadRow

    if rec.raw is not None:
        try:
            text = rec.raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadRow("undecodable_bytes", f"invalid UTF-8 at byte {e.start} of the line") from None
        try:  # without the line break: a string left open at the end of the line is "unterminated"
            return json.loads(text.rstrip("\r\n"))
        except json.JSONDecodeError as e:
            raise BadRow("invalid_json", json_error_detail(e, line=False)) from None
    if isinstance(rec.row, ReadProblem):
        raise BadRow(rec.row.reason, rec.row.detail)
    return rec.row

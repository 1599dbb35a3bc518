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

import codecs
import csv
import glob
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_batch.config import ConfigError

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


@dataclass
class RawRecord:
    file: str
    # 1-based line number for text files (line_kind "line"), 0-based row index for columnar files.
    index: int
    line_kind: str  # "line" | "row"
    raw: bytes | None = None  # JSON Lines: the undecoded line
    row: Any = None  # everything else: the decoded row

    def where(self) -> str:
        return f"{self.file}:{self.index}" if self.line_kind == "line" else f"{self.file} row {self.index}"


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


def iter_records(path: Path) -> Iterator[RawRecord]:
    name = _text_name(path)
    if not name.endswith(TEXT_SUFFIXES):
        yield from _iter_columnar(path)
        return
    rows = 0
    try:  # a gzip stream cut off or damaged part-way: the rows before it were read, the rest cannot be found
        for rec in _iter_jsonl(path) if name.endswith(JSONL_SUFFIXES) else _iter_whole_text(path, name):
            rows += 1
            yield rec
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise _unreadable(path, "gzip", e, rows_read=rows) from None


def _iter_whole_text(path: Path, name: str) -> Iterator[RawRecord]:
    with _open_bytes(path) as f:
        data = f.read()
    yield from (_iter_csv if name.endswith(CSV_SUFFIXES) else _iter_json)(path, data)


def _iter_columnar(path: Path) -> Iterator[RawRecord]:
    """Rows of a Parquet or Arrow file. Damage past the footer/schema (a bad page or record batch) stops the
    run with UnreadableInputError: the rows after it cannot be found, so they cannot be counted either."""
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
            for row in batch.to_pylist():
                yield RawRecord(name, i, "row", row=row)
                i += 1
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(path, "Parquet" if parquet else "Arrow IPC", e, rows_read=i) from None


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


def _iter_jsonl(path: Path) -> Iterator[RawRecord]:
    name = str(path)
    with _open_bytes(path) as f:
        for lineno, line in enumerate(f, start=1):
            if lineno == 1 and line.startswith(codecs.BOM_UTF8):
                # utf-8-sig: a byte order mark belongs to the file, not to the first row (else that row is
                # invalid JSON). Only the first line: a BOM elsewhere is damage and stays a bad row.
                line = line[len(codecs.BOM_UTF8) :]
            if not line.strip():
                continue  # blank lines (often a trailing one) are not rows
            yield RawRecord(name, lineno, "line", raw=line)


def _utf8_text(name: str, data: bytes) -> str | RawRecord:
    """The file's text (a leading byte order mark skipped: utf-8-sig, as for JSON Lines), or the one bad row
    naming where it stops being UTF-8 (nothing after that point can be split into rows reliably)."""
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: bom + e.start].count(b"\n") + 1
        return RawRecord(
            name, line, "line", row=ReadProblem("undecodable_bytes", f"invalid UTF-8 at byte {bom + e.start}")
        )


def _iter_csv(path: Path, data: bytes) -> Iterator[RawRecord]:
    """Rows of a CSV/TSV file with a header row, as {column: cell} with empty cells left out (a missing
    value, as a null column in Parquet). The line is the one the record starts on (quoted cells may span
    lines). A malformed record (an unclosed quote) is one `invalid_csv` row, and reading stops there."""
    name = str(path)
    text = _utf8_text(name, data)
    if isinstance(text, RawRecord):
        yield text
        return
    delimiter = "\t" if _text_name(path).endswith(".tsv") else ","
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    header: list[str] | None = None
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            yield RawRecord(
                name, start, "line", row=ReadProblem("invalid_csv", f"{e} (the record starting on this line)")
            )
            return
        if not any(c.strip() for c in cells):
            continue  # blank lines are not rows
        if header is None:
            header = [c.strip() for c in cells]
            continue
        if len(cells) != len(header):
            detail = f"{len(cells)} cells, the header has {len(header)} columns ({', '.join(header[:8])})"
            yield RawRecord(name, start, "line", row=ReadProblem("invalid_csv", detail))
            continue
        yield RawRecord(name, start, "line", row={k: v for k, v in zip(header, cells) if v != ""})


def _iter_json(path: Path, data: bytes) -> Iterator[RawRecord]:
    name = str(path)
    text = _utf8_text(name, data)
    if isinstance(text, RawRecord):
        yield text
        return
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] == "[":
        yield from _iter_json_array(name, text, start + 1)
        return
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON Lines saved as .json
            yield from _iter_jsonl(path)
            return
        yield RawRecord(name, e.lineno, "line", row=ReadProblem("invalid_json", json_error_detail(e)))
        return
    if isinstance(obj, dict):
        # {"data": [...]} style wrappers: take the single list-valued key; else one row.
        lists = [v for v in obj.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
        rows = lists[0] if len(lists) == 1 and not any(k in obj for k in ("messages", "conversations")) else [obj]
    else:
        rows = [obj]
    for i, row in enumerate(rows):
        yield RawRecord(name, i, "row", row=row)


def _iter_json_array(name: str, text: str, pos: int) -> Iterator[RawRecord]:
    """The elements of a top-level JSON array one at a time (row i = element i), so a file that is cut off
    (a download or an export that stopped mid-record) still yields every complete record before the cut;
    the cut itself is one `truncated_file` row naming the byte offset. A syntax error elsewhere is one
    `invalid_json` row, and reading stops there (no way to find where the next record starts)."""
    dec = json.JSONDecoder()
    n, i = len(text), 0
    ws = " \t\r\n"
    while True:
        while pos < n and text[pos] in ws:
            pos += 1
        if pos < n and text[pos] == "]":
            return
        if pos >= n:
            yield RawRecord(
                name,
                i,
                "row",
                row=ReadProblem(
                    "truncated_file",
                    f"the file ends after {i} complete record(s) without the closing ']' "
                    f"(at byte {len(text[:pos].encode())}); the {i} records were read",
                ),
            )
            return
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            rest = text[e.pos :].strip()
            if e.msg.startswith("Unterminated string") or not rest or e.pos >= n - 1:
                offset = len(text[:pos].encode())
                yield RawRecord(
                    name,
                    i,
                    "row",
                    row=ReadProblem(
                        "truncated_file",
                        f"the file ends in the middle of record {i} (it starts at byte {offset}, "
                        f"line {e.doc.count(chr(10), 0, pos) + 1}); the {i} complete records before it were read",
                    ),
                )
            else:
                yield RawRecord(name, i, "row", row=ReadProblem("invalid_json", json_error_detail(e)))
            return
        yield RawRecord(name, i, "row", row=obj)
        i += 1
        pos = end
        while pos < n and text[pos] in ws:
            pos += 1
        if pos < n and text[pos] == ",":
            pos += 1
        elif pos < n and text[pos] != "]":
            line = text.count("\n", 0, pos) + 1
            yield RawRecord(
                name,
                i,
                "row",
                row=ReadProblem(
                    "invalid_json", f"expected ',' or ']' after record {i - 1} (line {line}); reading stopped there"
                ),
            )
            return


def json_error_detail(e: json.JSONDecodeError, line: bool = True) -> str:
    """ "Expecting ',' delimiter (line 3, column 18)": json's message and where (`line=False` for one JSON
    Lines record, whose line the record's location already names)."""
    return f"{e.msg} (line {e.lineno}, column {e.colno})" if line else f"{e.msg} (column {e.colno})"


class ReadProblem:
    """A record the reader could not turn into a row: the bad-row reason (formats.BAD_ROW_REASONS) and detail."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail

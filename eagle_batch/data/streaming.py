"""Text inputs (JSON Lines, JSON, CSV/TSV, each maybe gzipped) read as a stream with bounded memory.

A dataset is not trusted: one record may be a 50 MB string (or a gzip bomb's gigabytes), a file may be one
JSON array of millions of records. Every reader here holds at most one record of `max_row_bytes` (plus a
read chunk) in memory, whatever the file holds:

- JSON Lines: lines are read with a length cap; a longer line is skipped to its end, unread, and becomes one
  `row_too_long` bad row.
- JSON: a top-level array is split into its elements by a scanner that tracks strings and brackets (no
  element is parsed until it is whole; an element past the cap is skipped, not kept); a file that is not an
  array is either JSON Lines misnamed .json (streamed as such) or one record, read only if within the cap.
- CSV/TSV: physical lines feed `csv.reader` through a line source that counts each record's bytes and
  raises past the cap; the record becomes a bad row and reading goes on at the next line.
- gzip: the decompressed bytes of one file are capped too (`max_decompressed_bytes`): past it the rest of the
  file is one `file_too_large` bad row, and the other inputs are read as usual.

Every problem is a counted bad row (`ReadProblem`, by file and line/row), never the end of `prepare`.
"""

from __future__ import annotations

import codecs
import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .records import RawRecord, ReadProblem, json_error_detail, utf8_text

CHUNK = 1 << 20  # bytes read at a time while scanning
_WS = b" \t\r\n"


@dataclass(frozen=True)
class ReadLimits:
    """The caps of `data.max_row_bytes` and `data.max_decompressed_bytes` (0 = no cap)."""

    max_row_bytes: int = 16 << 20
    max_decompressed_bytes: int = 64 << 30

    @classmethod
    def from_config(cls, data_cfg: Any) -> "ReadLimits":
        return cls(int(data_cfg.max_row_bytes), int(data_cfg.max_decompressed_bytes))


DEFAULT_LIMITS = ReadLimits()  # the schema's defaults (config/schema.py, DataConfig)


class FileTooLarge(Exception):
    """The decompressed bytes of one input passed `max_decompressed_bytes`."""


class CappedReader:
    """`read` / `readline` of a binary stream, counting the bytes; FileTooLarge past `limit` (0 = none)."""

    def __init__(self, f, limit: int):
        self.f, self.limit, self.count = f, limit, 0

    def _counted(self, data: bytes) -> bytes:
        self.count += len(data)
        if self.limit and self.count > self.limit:
            raise FileTooLarge(self.count)
        return data

    def read(self, n: int = -1) -> bytes:
        return self._counted(self.f.read(n))

    def readline(self, n: int = -1) -> bytes:
        return self._counted(self.f.readline(n))


def too_large_problem(limits: ReadLimits):

    return ReadProblem(
        "file_too_large",
        f"the file decompresses to more than data.max_decompressed_bytes={limits.max_decompressed_bytes} bytes "
        "(a decompression bomb, or a file larger than allowed); the rows before this point were read, the rest "
        "was not: raise data.max_decompressed_bytes if the file is genuine",
    )


def too_long_problem(what: str, size: int, limits: ReadLimits, skipped: bool = True):

    return ReadProblem(
        "row_too_long",
        f"{what} is {'at least ' if not skipped else ''}{size} bytes, over data.max_row_bytes={limits.max_row_bytes}"
        "; it was skipped unread (raise data.max_row_bytes if such records are genuine)",
    )


def _skip_line(f) -> int:
    """Read the rest of a physical line without keeping it; the bytes skipped."""
    n = 0
    while True:
        part = f.readline(CHUNK)
        n += len(part)
        if not part or part.endswith(b"\n"):
            return n


# ------------------------------------------------------------------------------------------- JSON Lines
def iter_jsonl(f, name: str, limits: ReadLimits, first_line: int = 1) -> Iterator:
    """RawRecords of JSON Lines from binary stream `f`, each line at most `max_row_bytes` (else a bad row)."""

    cap = limits.max_row_bytes
    lineno = first_line - 1
    while True:
        line = f.readline(cap + 1 if cap else -1)
        if not line:
            return
        lineno += 1
        if lineno == 1 and line.startswith(codecs.BOM_UTF8):
            # utf-8-sig: a byte order mark belongs to the file, not to the first row (else that row is invalid
            # JSON). Only the first line: a BOM elsewhere is damage and stays a bad row.
            line = line[len(codecs.BOM_UTF8) :]
        if cap and len(line) > cap and not line.endswith(b"\n"):
            size = len(line) + _skip_line(f)
            yield RawRecord(name, lineno, "line", row=too_long_problem("the line", size, limits))
            continue
        if not line.strip():
            continue  # blank lines (often a trailing one) are not rows
        yield RawRecord(name, lineno, "line", raw=line)


# ------------------------------------------------------------------------------------------------- JSON
_OUTSIDE = re.compile(rb'["\[\]{},]')
_INSIDE = re.compile(rb'["\\]')


class _ArrayScanner:
    """The elements of a top-level JSON array as byte strings, read from `f` a chunk at a time."""

    def __init__(self, f, buf: bytes, pos: int, cap: int):
        self.f, self.buf, self.pos, self.cap = f, buf, pos, cap
        self.base = 0  # file offset (after any BOM) of buf[0]
        self.lines = 0  # newlines in the bytes dropped before buf[0]
        self.eof = False

    def _more(self, keep_from: int) -> None:
        """Drop buf before `keep_from` (indexes into buf move down by it), then read a chunk."""
        self.lines += self.buf.count(b"\n", 0, keep_from)
        self.base += keep_from
        chunk = self.f.read(CHUNK)
        self.eof = not chunk
        self.buf = self.buf[keep_from:] + chunk

    def line_at(self, i: int) -> int:
        return self.lines + self.buf.count(b"\n", 0, i) + 1

    def skip_ws(self) -> bool:
        """Move past whitespace; False at the end of the input."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return True
            if self.eof:
                return False
            self._more(self.pos)
            self.pos = 0

    def element(self) -> tuple[bytes | None, int, int, str]:
        """(element bytes, or None when over the cap; its byte offset; its size; how it ended: ',' | ']' |
        'eof'). Strings are skipped whole (a bracket or comma inside one is text); depth counts brackets."""
        offset = self.base + self.pos
        start = i = self.pos  # start: where the element begins in buf, -1 once over the cap and dropped
        depth, skipped, in_str = 0, 0, False
        while True:
            if start >= 0 and self.cap and i - start > self.cap:  # over the cap: keep nothing more of it
                skipped = i - start
                self._more(i)
                start, i = -1, 0
                continue
            m = (_INSIDE if in_str else _OUTSIDE).search(self.buf, i)
            if m is None or (m.group() == b"\\" and m.start() + 1 >= len(self.buf)):
                if self.eof:  # what was kept of the element (a whole one when the closing ']' is missing)
                    kept = bytes(self.buf[start:]) if start >= 0 else None
                    return kept, offset, skipped, "eof"
                i = len(self.buf) if m is None else m.start()  # an escape cut by the chunk: scan it again
                keep = start if start >= 0 else i
                if start < 0:
                    skipped += keep
                self._more(keep)
                i -= keep
                if start >= 0:
                    start = 0
                continue
            j, c = m.start(), m.group()
            if in_str:
                in_str, i = (True, j + 2) if c == b"\\" else (False, j + 1)
            elif c == b'"':
                in_str, i = True, j + 1
            elif c in (b"[", b"{"):
                depth, i = depth + 1, j + 1
            elif c in (b"]", b"}") and depth > 0:
                depth, i = depth - 1, j + 1
            elif depth == 0 and c in (b",", b"]"):
                self.pos = j + 1
                if start < 0:
                    return None, offset, skipped + j, c.decode()
                return bytes(self.buf[start:j]), offset, j - start, c.decode()
            else:
                i = j + 1


def iter_json_array(f, name: str, head: bytes, pos: int, limits: ReadLimits) -> Iterator:
    """Elements of the top-level JSON array in `f` (`head` read so far, `pos` past its '['), one at a time:
    row i = element i. A cut-off file yields every complete record before the cut, then one
    `truncated_file` row naming the byte offset; an element that is not JSON is one `invalid_json` row and
    reading goes on with the next; one over `max_row_bytes` is one `row_too_long` row."""

    s = _ArrayScanner(f, head, pos, limits.max_row_bytes)
    i = 0
    while True:
        if not s.skip_ws():
            detail = (
                f"the file ends after {i} complete record(s) without the closing ']' (at byte {s.base + s.pos}); "
                f"the {i} records were read"
            )
            yield RawRecord(name, i, "row", row=ReadProblem("truncated_file", detail))
            return
        if s.buf[s.pos] == ord("]") and i == 0:
            return
        first_line = s.line_at(s.pos)
        data, offset, size, end = s.element()
        if end == "eof" and data is not None and data.strip() and _is_json(data):
            yield RawRecord(name, i, "row", row=_decode_element(data, first_line))
            detail = (
                f"the file ends after {i + 1} complete record(s) without the closing ']' (at byte "
                f"{offset + len(data)}); the {i + 1} records were read"
            )
            yield RawRecord(name, i + 1, "row", row=ReadProblem("truncated_file", detail))
            return
        if end == "eof":
            detail = (
                f"the file ends in the middle of record {i} (it starts at byte {offset}, line {first_line}); "
                f"the {i} complete records before it were read"
            )
            yield RawRecord(name, i, "row", row=ReadProblem("truncated_file", detail))
            return
        if data is None:
            yield RawRecord(name, i, "row", row=too_long_problem(f"record {i} (line {first_line})", size, limits))
        elif not data.strip():
            if end == "]" and i > 0:
                yield RawRecord(name, i, "row", row=ReadProblem("invalid_json", "a comma before the closing ']'"))
                return
            yield RawRecord(name, i, "row", row=ReadProblem("invalid_json", f"record {i} is empty (line {first_line})"))
        else:
            yield RawRecord(name, i, "row", row=_decode_element(data, first_line))
        i += 1
        if end == "]":
            return


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
        return True
    except ValueError:
        return False


def _decode_element(data: bytes, line: int) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return ReadProblem("undecodable_bytes", f"invalid UTF-8 at byte {e.start} of the record (line {line})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return ReadProblem("invalid_json", f"{e.msg} (record starting on line {line}, its line {e.lineno})")


def iter_json(f, name: str, limits: ReadLimits) -> Iterator:
    """A .json file: a top-level array streamed (iter_json_array); else, within `max_row_bytes`, an object
    (one row, or the rows of a {"data": [...]} wrapper's one list) or JSON Lines misnamed .json; past the cap,
    JSON Lines when its first line is a whole JSON value, else one `row_too_long` row."""

    cap = limits.max_row_bytes
    head = f.read(CHUNK if not cap else min(cap + 1, CHUNK))
    bom = len(codecs.BOM_UTF8) if head.startswith(codecs.BOM_UTF8) else 0
    start = bom
    while start < len(head) and head[start] in _WS:
        start += 1
    if head[start : start + 1] == b"[":
        yield from iter_json_array(f, name, head[bom:], start + 1 - bom, limits)
        return
    rest = f.read((cap + 1 - len(head)) if cap else -1) if not cap or len(head) <= cap else b""
    data = head + rest
    if cap and len(data) > cap:
        first = data[: data.find(b"\n") + 1] if b"\n" in data else b""
        try:
            json.loads(first[bom:])
        except ValueError:
            yield RawRecord(
                name, 1, "line", row=too_long_problem("the JSON document (not an array)", len(data), limits, False)
            )
            return
        yield from iter_jsonl(_Prefixed(data, f), name, limits)
        return
    text = utf8_text(name, data)
    if isinstance(text, RawRecord):
        yield text
        return
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON Lines saved as .json
            yield from iter_jsonl(_Prefixed(data, f), name, limits)
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


class _Prefixed:
    """`readline` over bytes already read, then the rest of the stream."""

    def __init__(self, head: bytes, f):
        self.head, self.f = head, f

    def readline(self, n: int = -1) -> bytes:
        if self.head:
            cut = self.head.find(b"\n") + 1 or len(self.head)
            if n >= 0:
                cut = min(cut, n)
            line, self.head = self.head[:cut], self.head[cut:]
            if line.endswith(b"\n") or (n >= 0 and len(line) >= n) or self.head:
                return line
            return line + self.f.readline(-1 if n < 0 else n - len(line))
        return self.f.readline(n)


# -------------------------------------------------------------------------------------------------- CSV
class _RecordTooLong(Exception):
    pass


class _Undecodable(Exception):
    pass


class _CsvLines:
    """Physical lines for csv.reader, decoded; each record's bytes counted (`new_record` resets the count):
    past `cap` the rest of the line is skipped and _RecordTooLong raised. An iterator class, not a generator:
    csv.reader goes on reading from it after such an exception."""

    def __init__(self, f, cap: int):
        self.f, self.cap, self.record_bytes, self.lineno = f, cap, 0, 0

    def __iter__(self):
        return self

    def new_record(self) -> int:
        self.record_bytes = 0
        return self.lineno + 1

    def __next__(self) -> str:
        left = self.cap - self.record_bytes if self.cap else -1
        line = self.f.readline(left + 1 if self.cap else -1)
        if not line:
            raise StopIteration
        self.lineno += 1
        if self.lineno == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8) :]
        self.record_bytes += len(line)
        if self.cap and self.record_bytes > self.cap and not line.endswith(b"\n"):
            self.record_bytes += _skip_line(self.f)
            raise _RecordTooLong(self.record_bytes)
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Undecodable(f"invalid UTF-8 at byte {e.start} of line {self.lineno}") from None


def iter_csv(f, name: str, tsv: bool, limits: ReadLimits) -> Iterator:
    """Rows of a CSV/TSV stream with a header row, as {column: cell} with empty cells left out (a missing
    value, as a null column in Parquet). The line is the one the record starts on (quoted cells may span
    lines). A malformed record (an unclosed quote) is one `invalid_csv` row, and reading stops there; a record
    over `max_row_bytes` or with bytes that are not UTF-8 is one bad row, and reading goes on."""

    lines = _CsvLines(f, limits.max_row_bytes)
    reader = csv.reader(lines, delimiter="\t" if tsv else ",", strict=True)
    header: list[str] | None = None
    while True:
        start = lines.new_record()
        try:
            cells = next(reader)
        except StopIteration:
            return
        except _RecordTooLong as e:
            yield RawRecord(
                name, start, "line", row=too_long_problem("the record starting on this line", e.args[0], limits)
            )
            continue
        except _Undecodable as e:
            yield RawRecord(name, start, "line", row=ReadProblem("undecodable_bytes", str(e)))
            continue
        except csv.Error as e:
            problem = ReadProblem("invalid_csv", f"{e} (the record starting on this line)")
            yield RawRecord(name, start, "line", row=problem)
            if "field larger than field limit" in str(e):
                continue  # the line was read whole: the next record starts on the next line
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

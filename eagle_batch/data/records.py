"""One record read from an input file, and the problems a reader reports instead of a row."""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from typing import Any


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


def utf8_text(name: str, data: bytes) -> str | RawRecord:
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


def json_error_detail(e: json.JSONDecodeError, line: bool = True) -> str:
    """ "Expecting ',' delimiter (line 3, column 18)": json's message and where (`line=False` for one JSON
    Lines record, whose line the record's location already names)."""
    return f"{e.msg} (line {e.lineno}, column {e.colno})" if line else f"{e.msg} (column {e.colno})"


class ReadProblem:
    """A record the reader could not turn into a row: the bad-row reason (formats.BAD_ROW_REASONS) and detail."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail

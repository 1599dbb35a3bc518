"""Accounting of prepare's rows: what was kept, what was skipped and why, per file; never silent.

Every row read ends as kept (one or more samples) or skipped with a reason from BAD_ROW_REASONS, and
every dropped sample has a reason from DROP_REASONS; both are written to RUN/prepared/bad_rows.jsonl with
the file and line/row. On top of the row-level reasons, `file_warnings()` says what is wrong with a whole
file (empty, no usable row and which fields it has instead, probably not UTF-8), and `NothingToPrepare`
is raised when no sample is left at all: a run never goes ahead on nothing.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO

import numpy as np

from eagle_batch.errors import UserError

from .formats import BAD_ROW_REASONS

DROP_DETAIL = {
    "too_few_loss_tokens": "fewer loss tokens (assistant tokens the draft learns) than data.min_loss_tokens after truncation"
}
# Reasons that mean "this row is not in the shape the config expects": the file's fields are then shown.
SHAPE_REASONS = ("unknown_format", "not_a_list", "not_an_object")
# A file whose rows fail to decode this often (and at least this many) is probably in another encoding; fewer
# undecodable rows still get the conversion hint, worded as a possibility.
NOT_UTF8_MIN_ROWS, NOT_UTF8_FRACTION = 3, 0.5
_CHAT_LIKE = re.compile(r"conv|messag|chat|dialog|turn|history", re.IGNORECASE)
# Column names of single-turn datasets (question/answer, query/completion, ...): the pair to suggest as
# data.prompt_field / data.response_field.
_PROMPT_LIKE = re.compile(r"^(question|query|prompt|input|instruction|user|human|problem)s?$", re.IGNORECASE)
_RESPONSE_LIKE = re.compile(r"^(answer|response|output|completion|target|assistant|gpt|solution)s?$", re.IGNORECASE)


class BadRowError(UserError, ValueError):
    """A bad input row with data.on_bad_row=error."""


class NothingToPrepare(UserError):
    """No sample is left from any input file; the message says, per file, why."""


@dataclass
class FileTally:
    rows: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)  # samples read but not kept (too few loss tokens, duplicates)
    fields: Counter = field(default_factory=Counter)  # keys of the rows skipped for their shape
    formats: Counter = field(default_factory=Counter)  # rows read as each format
    mixed: Counter = field(default_factory=Counter)  # (format read, other format present) -> rows
    mixed_first: dict = field(default_factory=dict)  # (format read, other format present) -> first line/row

    def read_as(self, fmt: str, also: tuple[str, ...], where: str) -> None:
        """A row was read as `fmt` and also holds the fields of the formats in `also`."""
        self.formats[fmt] += 1
        for other in also:
            self.mixed[fmt, other] += 1
            self.mixed_first.setdefault((fmt, other), where)


@dataclass
class Sample:
    sample_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    file: str
    row: int


class Tally:
    """Takes prepare's RowResults in input order; keeps the samples and writes bad_rows.jsonl."""

    def __init__(self, data_cfg, bad_rows: IO[str], files: list[str]):
        self.d = data_cfg
        self.bad_rows = bad_rows
        self.files = {f: FileTally() for f in files}
        self.skipped: Counter = Counter()
        self.dropped: Counter = Counter()
        self.unrendered: Counter = Counter()
        self.samples: list[Sample] = []
        self.examples: list[str] = []  # the first few bad rows, for the error when nothing is kept
        self._seen: dict[str, int] = {}
        self.rows_read = self.rows_kept = self.truncated = self.split_rows = self.tokens = 0
        self.empty_turns_masked = self.turns_untrained = self.loss_tokens_cut = 0

    def add(self, res) -> None:
        self.rows_read += 1
        ft = self.files.setdefault(res.file, FileTally())
        ft.rows += 1
        loc = {"file": res.file, res.line_kind: res.index}
        if res.bad is not None:
            self._bad(res, ft, loc)
            return
        if res.format:
            ft.read_as(res.format, res.also, f"{res.line_kind} {res.index}")
        self.truncated += res.truncated
        self.loss_tokens_cut += res.loss_tokens_cut
        self.split_rows += int(res.split)
        self.empty_turns_masked += res.empty_turns_masked
        self.turns_untrained += res.turns_untrained
        for name in res.unrendered:
            self.unrendered[name] += 1
        for reason in res.dropped:
            self.dropped[reason] += 1
            ft.dropped[reason] += 1
            self._write({**loc, "reason": reason, "detail": DROP_DETAIL[reason]})
        kept = [self._keep(sid, ids, mask, res, loc) for sid, ids, mask in res.samples]
        ft.dropped["duplicate"] += kept.count(False)
        if any(kept):
            self.rows_kept += 1
            ft.kept += 1

    def _bad(self, res, ft: FileTally, loc: dict) -> None:
        reason, detail = res.bad
        where = f"{res.file}:{res.index}" if res.line_kind == "line" else f"{res.file} row {res.index}"
        if self.d.on_bad_row == "error":
            raise BadRowError(
                f"{where}: {reason} ({BAD_ROW_REASONS[reason]}): {detail}. Fix or remove this row, or "
                "set data.on_bad_row=skip to count and skip bad rows (they are then listed in "
                "RUN/prepared/bad_rows.jsonl)."
            )
        self.skipped[reason] += 1
        ft.skipped[reason] += 1
        if reason in SHAPE_REASONS:
            ft.fields.update(res.keys)
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {reason}: {detail}")
        self._write({**loc, "reason": reason, "detail": detail})

    def _keep(self, sid: str, ids, mask, res, loc: dict) -> bool:
        if sid in self._seen:
            first = self.samples[self._seen[sid]]
            if self.d.dedupe:
                self.dropped["duplicate"] += 1
                self._write(
                    {
                        **loc,
                        "reason": "duplicate",
                        "detail": f"same tokens as sample {sid} from {first.file} {first.row}",
                    }
                )
                return False
            k = 1  # without dedupe, sample ids must still be unique: stores resume by id
            while f"{sid}-{k}" in self._seen:
                k += 1
            sid = f"{sid}-{k}"
        self._seen[sid] = len(self.samples)
        self.samples.append(Sample(sid, ids, mask, res.file, res.index))
        self.tokens += len(ids)
        return True

    def _write(self, obj: dict) -> None:
        self.bad_rows.write(json.dumps(obj) + "\n")

    def file_warnings(self) -> list[str]:
        """What is wrong with whole input files (empty, nothing usable, probably not UTF-8)."""
        return file_warnings(self.files, self.d)

    def nothing_kept(self, n_files: int) -> NothingToPrepare:
        lines = [
            f"nothing to prepare: no sample from {n_files} input file(s) ({self.rows_read} rows read"
            + (f"; skipped: {reasons_text(self.skipped)}" if self.skipped else "")
            + (f"; samples dropped: {reasons_text(self.dropped)}" if self.dropped else "")
            + ")."
        ]
        lines += [f"  {w}" for w in self.file_warnings()]
        if self.examples:
            lines.append("  first bad rows:")
            lines += [f"    {e}" for e in self.examples]
        return NothingToPrepare("\n".join(lines))


# ----------------------------------------------------------------------------------------- whole files
def file_warnings(files: dict[str, FileTally], data_cfg) -> list[str]:
    """What is wrong with whole input files (empty, nothing usable, probably not UTF-8), one line each."""
    out = []
    for name, ft in files.items():
        if ft.rows == 0:
            out.append(f"{name}: no rows (the file is empty)")
            continue
        out += _mixed_format_warnings(name, ft)
        bad_utf8 = ft.skipped.get("undecodable_bytes", 0)
        likely = bad_utf8 >= min(NOT_UTF8_MIN_ROWS, ft.rows) and bad_utf8 >= NOT_UTF8_FRACTION * ft.rows
        if bad_utf8:  # a Latin-1 file is ASCII in most rows: the few with an accent are the only ones that fail
            out.append(
                f"{name}: {bad_utf8} of {ft.rows} rows are not valid UTF-8"
                + (
                    ": the file is probably in another encoding"
                    if likely
                    else " (skipped): if the file is in another encoding"
                )
                + " (Latin-1, Windows-1252, ...), convert it, e.g. `iconv -f latin1 -t utf-8 IN > OUT`, and point "
                "data.inputs at the converted file"
            )
        if ft.kept == 0 and not likely:
            out.append(
                f"{name}: none of its {ft.rows} rows could be used ({reasons_text(ft.skipped + ft.dropped)})"
                + _field_hint(ft, data_cfg)
            )
    return out


def _mixed_format_warnings(name: str, ft: FileTally) -> list[str]:
    """Rows holding the fields of two formats (e.g. both `messages` and `prompt`/`response`): auto read
    them one way; say so, once per pair, with the setting that reads them the other way."""
    return [
        f"{name}: {n} row(s) hold the fields of both the {used} and the {other} format (first: "
        f"{ft.mixed_first[used, other]}); data.format=auto read them as {used}; set data.format={other} "
        f"to read them as {other}"
        for (used, other), n in sorted(ft.mixed.items())
    ]


def _field_hint(ft: FileTally, d) -> str:
    """What the rows hold instead and the one setting to change. With data.format fixed, only that format's
    field was looked for: rows holding another format's field need data.format changed, not a field name
    (suggesting data.messages_field=messages when it already is would send the user in a circle)."""
    if not ft.fields:
        return ""
    names = [k for k, _ in ft.fields.most_common(12)]
    fmt = getattr(d, "format", "auto")
    wanted = {
        "messages": f"'{d.messages_field}' (data.messages_field)",
        "sharegpt": f"'{d.conversations_field}' (data.conversations_field)",
        "prompt_response": f"'{d.prompt_field}' + '{d.response_field}' (data.prompt_field, data.response_field)",
        "alpaca": "'instruction' + 'output' (Alpaca)",
    }
    looked = (
        f"{wanted['messages']}, {wanted['sharegpt']}, {wanted['prompt_response']} or {wanted['alpaca']}"
        if fmt not in wanted
        else f"{wanted[fmt]} only, as data.format={fmt}"
    )
    hint = f". Its rows have the fields {', '.join(names)}; eagle-batch looked for {looked}"
    present = {  # the other formats whose fields the rows have
        "messages": d.messages_field in ft.fields,
        "sharegpt": d.conversations_field in ft.fields,
        "prompt_response": d.prompt_field in ft.fields and d.response_field in ft.fields,
        "alpaca": "instruction" in ft.fields and "output" in ft.fields,
    }
    other = [f for f, has in present.items() if has and f != fmt]
    if fmt in wanted and other:
        return hint + f": the rows are in the {other[0]} format: set data.format={other[0]} (or data.format=auto)"
    chat = next((k for k in names if _CHAT_LIKE.search(k)), None)
    if not chat:
        return hint + _pair_hint(names, fmt)
    if fmt == "messages":
        return hint + f": if '{chat}' holds the turns, set data.messages_field={chat}"
    if fmt == "sharegpt":
        return hint + f": if '{chat}' holds the turns, set data.conversations_field={chat}"
    return hint + (
        f": if '{chat}' holds the turns, set data.messages_field={chat} ({{role, content}} turns) or "
        f"data.conversations_field={chat} ({{from, value}} turns)"
        + (" and data.format=auto" if fmt == "prompt_response" else "")
    )


def _pair_hint(names: list[str], fmt: str) -> str:
    """': set data.prompt_field=question data.response_field=answer' when the rows hold such a pair."""
    prompt = next((k for k in names if _PROMPT_LIKE.match(k)), None)
    response = next((k for k in names if _RESPONSE_LIKE.match(k)), None)
    if not (prompt and response):
        return ""
    also = "" if fmt in ("auto", "prompt_response") else " data.format=prompt_response"
    return f": if '{prompt}' and '{response}' hold one exchange, set data.prompt_field={prompt} data.response_field={response}{also}"


def reasons_text(c: Mapping[str, int]) -> str:
    """{"too_long": 2, "invalid_json": 1} -> "invalid_json: 1, too_long: 2" (for summaries and messages)."""
    return ", ".join(f"{k}: {v}" for k, v in sorted(c.items()))

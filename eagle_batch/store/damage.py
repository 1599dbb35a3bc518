"""What a reader does with committed rows that fail their checksum: one error naming everything, or a skip.

`damaged_error(...)` builds the `DamagedDataError` a reader raises: the store, the array, the shard and inner
chunk, the samples that chunk holds (indices and ids, from the committed record) and the repair
(`eagle-batch resume RUN --repair`). `DamagedSamples(on_damaged)` is what a consumer of samples (the
training loader, export-data) does with that error: `fail` (the default) re-raises it, `skip` leaves the
sample out with one warning line per sample and a total at the end (`summary()`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import crc32c
import numpy as np

from .errors import DamagedDataError, ShardError

ON_DAMAGED = ("fail", "skip")  # train.on_damaged, export-data --on-damaged


def run_of(store: Path) -> Path | None:
    """The run directory of a task store at RUN/stores/task-XXXXX.zarr (None for a store elsewhere)."""
    return store.parent.parent if store.parent.name == "stores" else None


def repair_advice(store: Path) -> str:
    run = run_of(store)
    if run is None:
        return "re-create the store from its source (it is not under a run's stores/, so `resume --repair` cannot)"
    return (
        f"run `eagle-batch resume {run} --repair` to extract them again (then `eagle-batch aggregate {run}`), "
        "or leave damaged samples out with train.on_damaged=skip (train) / --on-damaged skip (export-data)"
    )


def damaged_error(
    store: Path,
    lengths_bounds: np.ndarray,
    sample_ids: list[str],
    array: str,
    file: Path,
    span: tuple[int, int],
    shard: int,
    chunk: int,
    reason: str,
) -> DamagedDataError:
    """The error for committed tokens `span` [first, end) of `array` (its shard `shard`, inner chunk `chunk`, -1
    for the whole shard) that cannot be trusted; `lengths_bounds` is the record's sample bounds."""
    t0, t1 = span
    first = max(0, int(np.searchsorted(lengths_bounds, t0, side="right")) - 1)
    last = int(np.searchsorted(lengths_bounds, min(t1, int(lengths_bounds[-1])), side="left"))
    idx = list(range(first, min(max(last, first + 1), len(sample_ids))))
    ids = [sample_ids[i] for i in idx]
    where = f"chunk {chunk} of shard {shard}" if chunk >= 0 else f"shard {shard}"
    shown = ", ".join(ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")
    held = f"samples {idx[0]}..{idx[-1]} ({shown})" if idx else "no committed sample"
    try:
        rel = file.relative_to(store)
    except ValueError:
        rel = file
    message = (
        f"{store}: {array} {where} ({rel}) is damaged: {reason}. It holds {held}, which cannot be read; "
        f"{repair_advice(store)}."
    )
    return DamagedDataError(message, str(store), array, shard, chunk, ids, f"{array} {where} of {store}: {reason}")


def live_tail_intact(decoder, fd: int, entry: dict) -> bool:
    """Whether the shard file open as `fd` holds exactly the committed rows its record `entry` lists (decoded
    whole, against the raw crc32c). A store still being written may have re-encoded the tail chunk of its
    tail shard with rows appended since (the committed rows unchanged), or committed a new record since a
    reader read its own: then a chunk's crc32c differs from the reader's record while its rows are whole."""
    data = os.pread(fd, os.fstat(fd).st_size, 0)
    try:
        rows = decoder.rows(data, int(entry["tokens"]), "")
    except ShardError:
        return False
    return crc32c.crc32c(rows) == int(entry["raw_crc32c"])


class DamagedSamples:
    """A consumer's policy for samples whose data are damaged (`on_damaged`: fail | skip) and its count."""

    def __init__(self, on_damaged: str = "fail", who: str = "eagle-batch"):
        if on_damaged not in ON_DAMAGED:
            raise ValueError(f"on_damaged={on_damaged!r}: use one of {', '.join(ON_DAMAGED)}")
        self.on_damaged, self.who = on_damaged, who
        self.skipped: dict[str, str] = {}  # sample id -> why

    def handle(self, err: DamagedDataError, sample_id: str) -> None:
        """Raise `err` (fail), or note `sample_id` as skipped with one warning line the first time (skip)."""
        if self.on_damaged == "fail":
            raise err
        if sample_id not in self.skipped:
            self.skipped[sample_id] = err.reason
            print(
                f"[{self.who}] warning: skipped damaged sample {sample_id}: {err.reason}", file=sys.stderr, flush=True
            )

    def summary(self) -> str:
        """One line: how many samples were skipped and what to run (empty when none)."""
        if not self.skipped:
            return ""
        ids = list(self.skipped)
        shown = ", ".join(ids[:10]) + (", ..." if len(ids) > 10 else "")
        return (
            f"[{self.who}] skipped {len(ids)} damaged sample(s) in all ({shown}); `eagle-batch verify` names the "
            "damaged shards and `eagle-batch resume RUN --repair` extracts them again"
        )

"""The committed record (`progress.json`): the only thing readers trust while a store is written.

It lists the committed samples (ids and lengths, in store order) and, per token array, one entry per shard
(tokens, file size and crc32c, crc32c of the raw rows). Shard k of every array must be listed with
`min(shard_tokens, num_tokens - k * shard_tokens)` tokens (`uncovered_shards`): a record covers its own
tokens, or the store is damaged. The record is replaced atomically (durable.write_json_atomic), so a crash
leaves either the old or the new one; the arrays' `zarr.json` shapes follow it (`write_shapes`), never
precede it, so a plain zarr reader never sees a region that was not written.

`Progress` is a writer's in-memory view: the last record written and the samples appended since.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from .crc import SEAL_KEY, seal_problem, sealed
from .durable import write_json_atomic
from .errors import StoreCorruptError, StoreError
from .format import FORMAT_NAME, PROGRESS_NAME, ArrayLayout, format_version_for, load_json, token_arrays


def empty_record(dtype: str) -> dict:
    """The record of a new store of hidden-state `dtype`: no samples, an empty shard table per token array."""
    return {
        "format": FORMAT_NAME,
        "format_version": format_version_for(dtype),
        "commit": 0,
        "committed_at": "",
        "num_samples": 0,
        "num_tokens": 0,
        "sample_ids": [],
        "lengths": [],
        "shards": {n: [] for n in token_arrays(dtype)},
    }


RECORD_KEYS = frozenset(
    ("format", "format_version", "commit", "committed_at", "num_samples", "num_tokens", "sample_ids", "lengths")
    + ("shards", SEAL_KEY)
)


def write_record(store: Path, record: dict, fsync: bool) -> None:
    """Replace `progress.json` atomically with `record`, sealed (crc.sealed): the commit point."""
    write_json_atomic(store / PROGRESS_NAME, sealed(record), fsync)


def read_record(store: str | os.PathLike) -> dict:
    """The committed record, its seal checked: a damaged record raises StoreCorruptError naming the file."""
    p = Path(store) / PROGRESS_NAME
    r = load_json(p, "not an eagle-batch task store (or it was never created); check the path")
    if not isinstance(r, dict) or r.get("format") != FORMAT_NAME:
        got = r.get("format") if isinstance(r, dict) else type(r).__name__
        raise StoreError(f"{p}: format {got!r} is not {FORMAT_NAME!r}; not an eagle-batch task store")
    problem = seal_problem(r, RECORD_KEYS)
    if problem:
        raise StoreCorruptError(
            f"{p} (the store's committed record) is damaged: {problem}. Nothing in {Path(store)} can be trusted "
            "without it: delete that store and run `eagle-batch resume RUN` to extract its task again."
        )
    return r  # with its seal (provenance.record_digest); a writer's Progress drops it


def committed_samples(store: Path) -> int:
    """Samples in a task store's committed record (0 when it has none yet or cannot be read)."""
    try:
        return int(json.loads((Path(store) / PROGRESS_NAME).read_bytes())["num_samples"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def record_problems(record: dict) -> list[str]:
    """What is inconsistent within a record itself (counts, lengths, ids); [] when nothing."""
    n, t = record.get("num_samples"), record.get("num_tokens")
    ids, lengths = record.get("sample_ids", []), record.get("lengths", [])
    out = []
    if not (len(ids) == len(lengths) == n):
        out.append(f"{PROGRESS_NAME}: num_samples={n} but {len(ids)} ids and {len(lengths)} lengths")
    if sum(lengths) != t:
        out.append(f"{PROGRESS_NAME}: lengths sum to {sum(lengths)}, num_tokens is {t}")
    if len(set(ids)) != len(ids):
        out.append(f"{PROGRESS_NAME}: duplicate sample ids")
    if any(x <= 0 for x in lengths):
        out.append(f"{PROGRESS_NAME}: a sample has no tokens")
    return out


def sample_bounds(lengths) -> np.ndarray:
    """[0, cumsum(lengths)]: sample i is tokens bounds[i]:bounds[i + 1]."""
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


def committed_samples_of_shard(record: dict, shard_tokens: int, k: int) -> list[int]:
    """Sample indices whose tokens overlap shard k (what a repair must recompute)."""
    bounds = sample_bounds(record["lengths"])
    lo, hi = k * shard_tokens, (k + 1) * shard_tokens
    first = int(np.searchsorted(bounds, lo, side="right") - 1)
    last = int(np.searchsorted(bounds, hi, side="left"))
    return list(range(max(first, 0), min(last, len(record["lengths"]))))


def shard_table(record: dict, name: str) -> dict[int, dict]:
    """Array `name`'s shard entries by shard index."""
    return {int(s["index"]): s for s in record["shards"].get(name, [])}


def expected_shards(shard_tokens: int, num_tokens: int) -> list[tuple[int, int]]:
    """(k, tokens) of every shard that `num_tokens` committed tokens reach: only the last may be partial."""
    return [(k, min(shard_tokens, num_tokens - k * shard_tokens)) for k in range(-(-num_tokens // shard_tokens))]


def uncovered_shards(table: dict[int, dict], shard_tokens: int, num_tokens: int) -> list[tuple[int, int, dict | None]]:
    """(k, tokens the record needs there, the table's entry or None) for every shard whose entry is missing
    or lists another token count: there the record does not cover its own tokens."""
    return [
        (k, want, table.get(k))
        for k, want in expected_shards(shard_tokens, num_tokens)
        if k not in table or table[k]["tokens"] != want
    ]


def write_shapes(store: Path, layouts: dict[str, ArrayLayout], num_tokens: int, fsync: bool) -> None:
    """Each token array's zarr.json with `num_tokens` rows. Called only once a record covering them is on
    disk, so a plain zarr reader never sees a shape that covers unwritten shards. Synced too, so a power
    loss cannot leave an empty zarr.json on file systems that do not order a rename after the data."""
    for name, lay in layouts.items():
        write_json_atomic(store / name / "zarr.json", lay.zarr_json(num_tokens), fsync=fsync)


class Progress:
    """A writer's record: `record` as last written (what a crash leaves) and the samples appended since.

    `tables[name][k]` is shard k's entry of array `name`: the committed one, or the entry of a shard written
    since, which the next record will list (a tail shard's rewrite replaces its older entry)."""

    def __init__(self, record: dict):
        record.pop(SEAL_KEY, None)  # sealed anew by each write
        self.record = record
        self.sample_ids: list[str] = list(record["sample_ids"])
        self.lengths: list[int] = list(record["lengths"])
        self.id_set = set(self.sample_ids)
        self.num_tokens = int(record["num_tokens"])
        self.tables = {n: shard_table(record, n) for n in record["shards"]}  # one per token array
        self._committed_ids: frozenset[str] | None = None

    @property
    def committed_ids(self) -> frozenset[str]:
        if self._committed_ids is None:  # cached: callers test membership once per sample
            self._committed_ids = frozenset(self.record["sample_ids"])
        return self._committed_ids

    @property
    def num_committed(self) -> int:
        return int(self.record["num_samples"])

    @property
    def has_uncommitted(self) -> bool:
        return len(self.sample_ids) != self.record["num_samples"]

    def add(self, sample_ids: list[str], token_ids: list) -> None:
        """Samples appended (not yet committed): their ids and token ids (one array per sample)."""
        for sid, ids in zip(sample_ids, token_ids):
            n = len(ids)
            self.sample_ids.append(sid)
            self.id_set.add(sid)
            self.lengths.append(n)
            self.num_tokens += n

    def truncate(self, keep: int) -> None:
        """Keep only the first `keep` samples."""
        self.sample_ids = self.sample_ids[:keep]
        self.lengths = self.lengths[:keep]
        self.id_set = set(self.sample_ids)
        self.num_tokens = int(sum(self.lengths))

    def write(self, store: Path, fsync: bool, *, new_commit: bool = True) -> None:
        """Replace `progress.json` atomically: the commit point. With `new_commit`, a record of every sample
        appended so far; without, the same samples with the current shard tables (a tail shard restored to
        its committed prefix)."""
        r = self.record
        if new_commit:
            r.update(
                commit=r["commit"] + 1,
                committed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                num_samples=len(self.sample_ids),
                num_tokens=self.num_tokens,
                sample_ids=list(self.sample_ids),
                lengths=list(self.lengths),
            )
        r["shards"] = {n: [table[k] for k in sorted(table)] for n, table in self.tables.items()}
        write_record(store, r, fsync)
        if new_commit:
            self._committed_ids = None

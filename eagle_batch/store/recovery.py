"""Opening a store for appending: create a new one, or bring an existing one back to its committed record.

Whatever a crash left, a writer continues from exactly the last committed record (`open_store`):
- a store without a record holds nothing committed (it was killed while being created): start it over;
- an existing store must have been written for the same model and config (StoreSpec.IDENTITY); it keeps its
  own layout and codec;
- everything the record does not name goes: `*.partial` files, shards past the record, and the index
  arrays and consolidated metadata of an interrupted finalize() (finalize.unfinalize);
- committed shards are checked cheaply (present, recorded size); a tail shard whose crc32c differs from the
  record was replaced by a commit that a kill interrupted before its record: its committed rows are
  decoded, checked against the record's raw crc32c and written back alone;
- damaged committed data raises StoreCorruptError; with `repair` (after a full verify) the record is
  truncated to the last sample that starts before the first damaged shard, so the samples from there on
  are recomputed; a complete store is un-finalized first;
- then the arrays' shapes are reset to the record.
`committed_tail` gives the writer's streams the committed tail shard to continue filling.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from .crc import sealed
from .durable import makedirs_durable, write_json_atomic
from .errors import ShardError, StoreCorruptError, StoreError, StoreMismatchError
from .finalize import unfinalize
from .format import (
    COMPLETE_NAME,
    FORMAT_NAME,
    LOCK_NAME,
    PARTIAL_SUFFIX,
    PROGRESS_NAME,
    ArrayLayout,
    Codec,
    format_version_for,
    make_layouts,
    read_attrs,
    read_layouts,
)
from .record import (
    Progress,
    empty_record,
    read_record,
    sample_bounds,
    uncovered_shards,
    write_record,
    write_shapes,
)
from .shard_codec import ShardDecoder, padded_chunks, write_shard
from .spec import StoreSpec
from .stream import chunk_encoder
from .verify import verify_store

# Problems of a full verify that make a repair truncate (the others, e.g. strays, the reopen removes).
_DAMAGE = ("missing", "truncated", "size", "checksum", "decode")


def open_store(
    path: Path, spec: StoreSpec, cfg: Any, chunk_tokens: int, *, fsync: bool, entropy_only: bool, repair: bool
) -> tuple[StoreSpec, dict[str, ArrayLayout], Progress]:
    """(the store's spec, its layouts, its record) of the store at `path`, created or recovered (module
    docstring). `cfg`: the StoreConfig a new store is created with; `chunk_tokens` its resolved chunk size.
    The caller holds the store's lock."""
    if (path / PROGRESS_NAME).is_file():
        return _Recovery(path, fsync, entropy_only).recover(spec, cfg, chunk_tokens, repair)
    layouts, progress = _create(path, spec, cfg, chunk_tokens, fsync)
    return spec, layouts, progress


def _create(path: Path, spec: StoreSpec, cfg: Any, chunk: int, fsync: bool) -> tuple[dict[str, ArrayLayout], Progress]:
    if chunk <= 0 or cfg.shard_tokens <= 0 or cfg.shard_tokens % chunk:
        raise ValueError(
            f"store.shard_tokens={cfg.shard_tokens} must be a positive multiple of "
            f"store.chunk_tokens={cfg.chunk_tokens}; fix the store section of the config."
        )
    layouts = make_layouts(spec, chunk, cfg.shard_tokens, Codec(cfg.codec, cfg.level, cfg.blocksize))
    # A half-created store (killed before progress.json existed) holds nothing committed: start over.
    ours = {LOCK_NAME, "zarr.json", *layouts}
    children = list(path.iterdir())
    foreign = [c.name for c in children if c.name not in ours and not c.name.endswith(PARTIAL_SUFFIX)]
    if foreign:
        raise StoreError(
            f"{path} is not empty and not an eagle-batch store (no {PROGRESS_NAME}; found "
            f"{', '.join(sorted(foreign)[:5])}); choose an empty or new path for the task store."
        )
    for child in children:
        if child.name != LOCK_NAME:
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    version = format_version_for(spec.dtype)
    attrs = {"eagle_batch": sealed({"format": FORMAT_NAME, "format_version": version, **spec.attributes()})}
    write_json_atomic(path / "zarr.json", {"zarr_format": 3, "node_type": "group", "attributes": attrs}, fsync)
    for name, lay in layouts.items():
        makedirs_durable(path / name, fsync)
        write_json_atomic(path / name / "zarr.json", lay.zarr_json(0), fsync)
    record = empty_record(spec.dtype)
    write_record(path, record, fsync)  # last: marks the store as created
    return layouts, Progress(record)


def committed_tail(
    store: Path, lay: ArrayLayout, table: dict[int, dict], num_tokens: int
) -> tuple[int, int, list[bytes], np.ndarray, int]:
    """Where appending continues in `lay`'s array: (shard, rows in it, its encoded full chunks as on disk,
    the rows of its partly filled chunk, crc32c of the full chunks' rows)."""
    shard, fill = divmod(num_tokens, lay.shard_tokens)
    none = np.empty((0, *lay.row_shape), lay.np_dtype)
    if fill == 0:
        return shard, 0, [], none, 0
    f = lay.shard_path(store, shard)
    data = f.read_bytes()
    decoder = ShardDecoder(lay)
    full, part = divmod(fill, lay.chunk_tokens)
    chunks = [data[int(o) : int(o + b)] for o, b in decoder.index(data, str(f))[:full]]
    if not part:
        return shard, fill, chunks, none, int(table[shard]["raw_crc32c"])
    rows = decoder.rows(data, fill, str(f))
    cut = full * lay.chunk_tokens
    return shard, fill, chunks, rows[cut:], crc32c.crc32c(rows[:cut])


class _Recovery:
    """An existing store, brought back to its committed record (module docstring)."""

    def __init__(self, path: Path, fsync: bool, entropy_only: bool):
        self.path = path
        self.fsync = fsync
        self.entropy_only = entropy_only

    def recover(
        self, spec: StoreSpec, cfg: Any, chunk_tokens: int, repair: bool
    ) -> tuple[StoreSpec, dict[str, ArrayLayout], Progress]:
        p = self.path
        stored = StoreSpec.from_attributes(read_attrs(p))
        bad = spec.mismatches(stored)
        if bad:
            raise StoreMismatchError(
                f"{p} was written for a different model/config: "
                + "; ".join(bad)
                + ". Point this task at a new run directory, or delete the store to recompute it."
            )
        self.layouts = read_layouts(p, stored.dtype)
        hs = self.layouts["hidden_states"]
        want, have = (chunk_tokens, cfg.shard_tokens, cfg.codec), (hs.chunk_tokens, hs.shard_tokens, hs.codec.name)
        if want != have:
            # Appending with the store's own layout is always correct; say so rather than fail a resume.
            warnings.warn(
                f"{p}: existing layout (chunk_tokens, shard_tokens, codec)={have} differs from the "
                f"config's {want}; keeping the store's layout.",
                stacklevel=4,  # the caller of TaskStoreWriter.open
            )
        self.progress = Progress(read_record(p))
        complete = (p / COMPLETE_NAME).is_file()
        for f in p.rglob("*" + PARTIAL_SUFFIX):
            f.unlink()
        if not complete:  # what an interrupted finalize() wrote; the next finalize() rewrites it
            unfinalize(p, self.fsync)
        for lay in self.layouts.values():
            self._drop_uncommitted_shards(lay)
        damaged = self._check_committed_files()
        if repair and not damaged:
            # A full check (file crc32c of every shard), so the repair also finds flipped bytes.
            damaged = [
                (x.shard * self.layouts[x.array].shard_tokens, str(x))
                for x in verify_store(p, False)
                if x.shard is not None and x.kind in _DAMAGE
            ]
        if damaged:
            if not repair:
                raise StoreCorruptError(
                    f"{p}: committed data is damaged: "
                    + "; ".join(msg for _, msg in damaged)
                    + ". Run `eagle-batch verify` on it; open with repair=True (`eagle-batch resume --repair`) "
                    "to recompute from the first damaged shard on, or delete the store to recompute all of it."
                )
            self._truncate_before(min(first_token for first_token, _ in damaged))
        write_shapes(p, self.layouts, self.progress.record["num_tokens"], self.fsync)
        return stored, self.layouts, self.progress  # the store's spec (e.g. its eagle-batch version)

    def _drop_uncommitted_shards(self, lay: ArrayLayout) -> None:
        root = self.path / lay.name / "c"
        if not root.is_dir():
            return
        keep = set(self.progress.tables[lay.name])
        for d in list(root.iterdir()):
            try:
                k = int(d.name)
            except ValueError:
                k = -1
            if k not in keep:
                shutil.rmtree(d) if d.is_dir() else d.unlink()

    def _check_committed_files(self) -> list[tuple[int, str]]:
        """Cheap checks of committed shards (existence, size; full crc of tail shards). -> (first token, msg)."""
        damaged = []
        for name, lay in self.layouts.items():
            table = self.progress.tables[name]
            for k, want, _ in uncovered_shards(table, lay.shard_tokens, self.progress.num_tokens):
                msg = f"{name} shard {k}: the record's shard table does not cover its {want} committed tokens"
                damaged.append((k * lay.shard_tokens, msg))
                table.pop(k, None)
            for k, info in sorted(table.items()):
                f = lay.shard_path(self.path, k)
                first = k * lay.shard_tokens
                if not f.is_file():
                    damaged.append((first, f"{name} shard {k} ({f.relative_to(self.path)}) is missing"))
                    continue
                if info["tokens"] < lay.shard_tokens:  # tail shard: may hold an interrupted commit's rewrite
                    data = f.read_bytes()
                    if len(data) == info["nbytes"] and crc32c.crc32c(data) == info["crc32c"]:
                        continue
                    try:
                        self._restore_tail_file(lay, k, info, data)
                    except (ShardError, StoreCorruptError, ValueError) as e:
                        damaged.append((first, f"{name} tail shard {k}: {e}"))
                elif f.stat().st_size != info["nbytes"]:
                    size = f.stat().st_size
                    msg = f"{name} shard {k} ({f.relative_to(self.path)}) has {size} bytes, the record says {info['nbytes']}"
                    damaged.append((first, msg))
        return damaged

    def _restore_tail_file(self, lay: ArrayLayout, k: int, info: dict, data: bytes) -> None:
        """An interrupted commit replaced the tail shard: keep exactly the committed prefix if it checks out."""
        where = str(lay.shard_path(self.path, k))
        rows = ShardDecoder(lay).rows(data, info["tokens"], where)
        if crc32c.crc32c(rows) != info["raw_crc32c"]:
            raise StoreCorruptError(f"{where}: the committed rows' crc32c does not match the record")
        self._rewrite_prefix_shard(lay, k, rows)

    def _rewrite_prefix_shard(self, lay: ArrayLayout, k: int, rows: np.ndarray) -> None:
        """Shard k holding exactly `rows`, its entry in the record (same samples, same commit)."""
        encoder = chunk_encoder(lay, self.entropy_only)
        chunks = [encoder.encode(c, None) for c in padded_chunks(lay, rows)]
        info = write_shard(self.path, lay, k, chunks, len(rows), crc32c.crc32c(rows), fsync=self.fsync)
        self.progress.tables[lay.name][k] = info
        self.progress.write(self.path, self.fsync, new_commit=False)

    def _truncate_before(self, token: int) -> None:
        """Drop committed samples from the last sample boundary <= `token` on (repair)."""
        lengths = self.progress.lengths
        bounds = sample_bounds(lengths)
        keep = int(np.searchsorted(bounds, token, side="right") - 1)
        t = int(bounds[keep])
        warnings.warn(
            f"{self.path}: repair drops committed samples {keep}..{len(lengths) - 1} "
            f"(from token {t}); they will be recomputed.",
            stacklevel=5,  # the caller of TaskStoreWriter.open
        )
        unfinalize(self.path, self.fsync)  # no longer complete: marker first
        for name, lay in self.layouts.items():
            table = self.progress.tables[name]
            for k in sorted(table):
                start = k * lay.shard_tokens
                f = lay.shard_path(self.path, k)
                if start >= t:
                    del table[k]
                    f.unlink(missing_ok=True)
                elif start + table[k]["tokens"] > t:  # the shard holding the new end: keep its prefix
                    rows = ShardDecoder(lay).rows(f.read_bytes(), t - start, str(f))
                    self._rewrite_prefix_shard(lay, k, rows)
        self.progress.truncate(keep)
        self.progress.write(self.path, self.fsync)

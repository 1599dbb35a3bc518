"""Read task stores and aggregated runs: what `open_dataset(path)` (source.py) returns.

    ds = open_dataset(RUN)                       # RUN/dataset.json (see aggregate) or one task store
    len(ds); x = ds[0]                           # {"input_ids", "loss_mask", "hidden_states", "sample_id"}
    aux = open_dataset(RUN, layer_ids=[2, 15, 27])  # only those layers (by layer id)
    ds.get_arrays(0, raw=True)                   # a float8 store's codes and scales, not dequantized

Hidden states come back as bf16 whatever the store's dtype: a float8 store's (float8_e4m3, float8_e5m2) are
dequantized (store/fp8.py); `raw=True` gives its uint8 codes and float32 row scales instead.

Everything comes from the committed record (`progress.json`), never from array shapes: a shape can
be ahead of the data after a crash and zarr reads the missing region as zeros.

Checksum coverage (the invariant every read path relies on): no byte of committed data reaches a caller
unchecked. The record and the group attributes are sealed JSON (their own crc32c, checked when read:
record.read_record, format.read_attrs; an aggregated run's dataset.json likewise); each shard's index has
its crc32c (checked when the shard is opened); each inner chunk's encoded bytes are checked against the
record's `chunk_crc32c` when `read_rows` reads them, once per chunk read, before decoding (CRC32C runs at
GB/s a core: bench loader measures the cost against reading unchecked). A store written before records
listed chunk crcs has each shard file checked whole against the record's crc32c the first time a process
opens it. Damage raises `DamagedDataError` naming the store, array, shard, chunk and samples, and the
repair; `damage.DamagedSamples` is how a consumer skips such samples instead (train.on_damaged,
export-data --on-damaged). Shard files are read
with `pread` on descriptors opened lazily per process (a DataLoader worker opens its own after fork;
pickling drops them), and an open descriptor keeps reading the same file even if a live writer
replaces the tail shard, whose committed prefix is identical anyway.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from .damage import damaged_error, live_tail_intact
from .errors import DamagedDataError, ShardError, StoreCorruptError, StoreError
from .format import (
    COMPLETE_NAME,
    DATASET_NAME,
    PROGRESS_NAME,
    SCALE_ARRAY,
    read_attrs,
    read_layouts,
)
from .fp8 import dequantize, float8
from .provenance import record_digest
from .record import read_record, sample_bounds, shard_table
from .shard_codec import ShardDecoder
from .spec import StoreSpec

MAX_OPEN_SHARDS = 64

# Re-exported: read_record (package API), read_attrs, read_layouts and DATASET_NAME (callers of this module).
__all__ = [
    "DATASET_NAME",
    "MAX_OPEN_SHARDS",
    "StoreDataset",
    "TaskStore",
    "read_attrs",
    "read_layouts",
    "read_record",
]


class TaskStore:
    """Read-only view of one task store's committed samples. Picklable; opens files lazily per process."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        metas: dict | None = None,
        attrs: dict | None = None,
        check_chunks: bool = True,
    ):
        self.path = Path(path)
        self._metas = metas  # consolidated array metadata from dataset.json, if any
        self._attrs = attrs
        self.check_chunks = check_chunks  # False only to measure the checks' cost (bench loader)
        self._pid = None

    def __getstate__(self) -> dict:
        return {**{k: self.__dict__[k] for k in ("path", "_metas", "_attrs", "check_chunks")}, "_pid": None}

    def _ensure(self) -> None:
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self.record = read_record(self.path)
        attrs = self._attrs or read_attrs(self.path)
        self.spec = StoreSpec.from_attributes(attrs)
        self.layouts = read_layouts(self.path, self.spec.dtype, self._metas)
        self._decoders = {n: ShardDecoder(lay) for n, lay in self.layouts.items()}
        self._offsets = sample_bounds(self.record["lengths"])
        if int(self._offsets[-1]) != int(self.record["num_tokens"]):
            raise StoreCorruptError(
                f"{self.path / PROGRESS_NAME}: lengths sum to {self._offsets[-1]} but "
                f"num_tokens is {self.record['num_tokens']}; run `eagle-batch verify`."
            )
        self._tables = {n: shard_table(self.record, n) for n in self.layouts}
        self._shards: OrderedDict[tuple[str, int], tuple] = OrderedDict()  # (fd, index, chunk crcs)
        self._whole_checked: set[tuple[str, int]] = set()

    # ----- metadata -----

    def __len__(self) -> int:
        self._ensure()
        return int(self.record["num_samples"])

    @property
    def num_tokens(self) -> int:
        self._ensure()
        return int(self.record["num_tokens"])

    @property
    def offsets(self) -> np.ndarray:
        self._ensure()
        return self._offsets

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def sample_ids(self) -> list[str]:
        self._ensure()
        return self.record["sample_ids"]

    @property
    def layer_ids(self) -> list[int]:
        self._ensure()
        return self.spec.layer_ids

    @property
    def dtype(self) -> str:
        """How the store keeps hidden states (store.dtype): bfloat16, float8_e4m3 or float8_e5m2."""
        self._ensure()
        return self.spec.dtype

    @property
    def is_complete(self) -> bool:
        return (self.path / COMPLETE_NAME).is_file()

    # ----- data -----

    def _damaged(self, name: str, k: int, c: int, reason: str) -> DamagedDataError:
        """The error for inner chunk c (-1: the whole shard) of shard k of `name`, naming its samples."""
        lay = self.layouts[name]
        t0 = k * lay.shard_tokens + max(c, 0) * lay.chunk_tokens
        t1 = t0 + (lay.chunk_tokens if c >= 0 else lay.shard_tokens)
        f = lay.shard_path(self.path, k)
        return damaged_error(self.path, self._offsets, self.sample_ids, name, f, (t0, t1), k, c, reason)

    def _entry(self, name: str, k: int) -> dict:
        entry = self._tables[name].get(k)
        if entry is None:
            raise self._damaged(name, k, -1, "the committed record has no entry for this shard")
        return entry

    def _shard(self, name: str, k: int) -> tuple[int, np.ndarray, np.ndarray | None]:
        """(descriptor, index, crc32c of each inner chunk as encoded) of shard k of `name`, opened once per
        process while it stays among the MAX_OPEN_SHARDS most recent. A store written before the record
        listed chunk crcs (None) has its whole shard file checked against the record's crc32c on first open."""
        key = (name, k)
        hit = self._shards.get(key)
        if hit is not None:
            self._shards.move_to_end(key)
            return hit
        lay = self.layouts[name]
        entry = self._entry(name, k)
        f = lay.shard_path(self.path, k)
        try:
            fd = os.open(f, os.O_RDONLY)
        except FileNotFoundError:
            raise self._damaged(name, k, -1, "the shard file is missing but the committed record covers it") from None
        size = os.fstat(fd).st_size
        n = lay.index_nbytes()
        crcs = entry.get("chunk_crc32c")
        try:
            if size < n:
                raise ShardError(str(f), f"the file is shorter ({size} bytes) than its shard index")
            if crcs is None and self.check_chunks and key not in self._whole_checked:
                data = os.pread(fd, size, 0)
                if size != entry["nbytes"] or crc32c.crc32c(data) != entry["crc32c"]:
                    raise ShardError(str(f), "the file's crc32c differs from the committed record")
                self._whole_checked.add(key)
            index = self._decoders[name].index(os.pread(fd, n, size - n), str(f))
        except ShardError as e:
            os.close(fd)
            raise self._damaged(name, k, -1, e.detail) from None
        hit = (fd, index, None if crcs is None or not self.check_chunks else np.asarray(crcs, dtype=np.uint64))
        self._shards[key] = hit
        if len(self._shards) > MAX_OPEN_SHARDS:
            old_fd = self._shards.popitem(last=False)[1][0]
            os.close(old_fd)
        return hit

    def _chunk_crc_ok(self, name: str, k: int) -> bool:
        """Whether shard k of a store still being written is whole although a chunk's crc32c differs from this
        reader's record (damage.live_tail_intact). A finished store's record never changes: once it is complete
        and this reader's record is its last one, a mismatch is damage; a reader whose record is older than the
        completion (it opened the store while it was written) checks the live tail as before."""
        if self.is_complete and int(read_record(self.path).get("commit", 0)) == int(self.record.get("commit", 0)):
            return False
        fd, index, _ = self._shards[(name, k)]
        if not live_tail_intact(self._decoders[name], fd, self._tables[name][k]):
            return False
        self._shards[(name, k)] = (fd, index, None)  # this descriptor's file is checked whole
        return True

    def read_rows(self, name: str, start: int, stop: int, layers: Sequence[int] | None = None) -> np.ndarray:
        """Rows [start, stop) of a token array as stored (hidden_states: uint16 bits), optionally some layers
        (positions along axis 1). Each inner chunk is checked against its crc32c in the committed record as it
        is read, before it is decoded (the module docstring's invariant); damage raises DamagedDataError."""
        self._ensure()
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(
                f"token range [{start}, {stop}) outside the {self.num_tokens} committed tokens of {self.path}"
            )
        lay = self.layouts[name]
        row_shape = lay.row_shape
        if layers is not None:
            row_shape = (len(layers), *lay.row_shape[1:])
        out = np.empty((stop - start, *row_shape), lay.np_dtype)
        dec = self._decoders[name]
        S, C = lay.shard_tokens, lay.chunk_tokens
        t = start
        while t < stop:
            k = t // S
            s0 = k * S
            e = min(stop, s0 + S)
            fd, index, crcs = self._shard(name, k)
            c0, c1 = (t - s0) // C, (e - 1 - s0) // C
            try:  # the shard's path is built on the error path only (this loop runs per chunk read)
                sel = dec.covered(index, c0, c1, "")
            except ShardError as err:
                raise self._damaged(name, k, c0, err.detail) from None
            first, last_end = int(sel[0, 0]), int(sel[-1, 0] + sel[-1, 1])
            contiguous = bool((sel[1:, 0] == sel[:-1, 0] + sel[:-1, 1]).all())
            blob = os.pread(fd, last_end - first, first) if contiguous else None
            for j, c in enumerate(range(c0, c1 + 1)):
                off, nb = int(sel[j, 0]), int(sel[j, 1])
                enc = blob[off - first : off - first + nb] if contiguous else os.pread(fd, nb, off)
                if len(enc) != nb:
                    raise self._damaged(name, k, c, "the shard file is truncated")
                if crcs is not None:
                    crc = crc32c.crc32c(enc)
                    if (c >= len(crcs) or crc != int(crcs[c])) and not self._chunk_crc_ok(name, k):
                        raise self._damaged(name, k, c, "its crc32c differs from the committed record")
                    crcs = self._shards[(name, k)][2]
                try:
                    chunk = dec.chunk(enc, c, "")
                except ShardError as err:
                    raise self._damaged(name, k, c, err.detail) from None
                cs = s0 + c * C  # first token of this chunk
                r0, r1 = max(t, cs), min(e, cs + C)
                part = chunk[r0 - cs : r1 - cs]
                if layers is not None:
                    part = part[:, layers]
                out[r0 - start : r1 - start] = part
            t = e
        return out

    def sample_arrays(self, i: int, layers: Sequence[int] | None = None, raw: bool = False) -> dict[str, Any]:
        """Sample i as numpy arrays: hidden_states as bf16's uint16 bits; with `raw` a float8 store's uint8 codes
        and `hidden_states_scale` (float32 [T, L]) instead (a bfloat16 store ignores `raw`)."""
        self._ensure()
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range: {self.path} has {n} committed samples")
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        try:
            out = {
                "input_ids": self.read_rows("input_ids", a, b),
                "loss_mask": self.read_rows("loss_mask", a, b),
                "hidden_states": self.read_rows("hidden_states", a, b, layers),
                "sample_id": self.sample_ids[i],
            }
            scales = self.read_rows(SCALE_ARRAY, a, b, layers) if SCALE_ARRAY in self.layouts else None
        except DamagedDataError as e:
            raise e.for_sample(self.sample_ids[i]) from None
        if scales is not None:
            if raw:
                out[SCALE_ARRAY] = scales
            else:
                out["hidden_states"] = dequantize(out["hidden_states"], scales, float8(self.spec.dtype))
        return out

    def token_arrays(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, loss_mask) of sample i, without reading its hidden states."""
        self._ensure()
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        try:
            return self.read_rows("input_ids", a, b), self.read_rows("loss_mask", a, b)
        except DamagedDataError as e:
            raise e.for_sample(self.sample_ids[i]) from None

    def get(self, i: int, layers: Sequence[int] | None = None, raw: bool = False) -> dict[str, Any]:
        """Sample i as torch tensors: hidden_states bf16; with `raw`, a float8 store's codes as
        torch.float8_e4m3fn or torch.float8_e5m2 (the store's encoding) and `hidden_states_scale` float32."""
        import torch

        x = self.sample_arrays(i, layers, raw)
        out = {
            "input_ids": torch.from_numpy(x["input_ids"].astype(np.int64)),
            "loss_mask": torch.from_numpy(x["loss_mask"]),
            "hidden_states": torch.from_numpy(x["hidden_states"]).view(torch.bfloat16),
            "sample_id": x["sample_id"],
        }
        if SCALE_ARRAY in x:
            out["hidden_states"] = torch.from_numpy(x["hidden_states"]).view(
                getattr(torch, float8(self.dtype).encoding)
            )
            out[SCALE_ARRAY] = torch.from_numpy(x[SCALE_ARRAY])
        return out

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.get(i)

    def sample_digest(self, i: int) -> str:
        """crc32c over the record's crc32c of every inner chunk (a store without chunk crcs: every shard) that
        holds sample i's tokens, in every array: it changes when any stored byte of the sample does (a
        repair), without reading the data."""
        self._ensure()
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        crc = 0
        for name in sorted(self.layouts):
            S, C = self.layouts[name].shard_tokens, self.layouts[name].chunk_tokens
            for k in range(a // S, (b - 1) // S + 1):
                e = self._tables[name].get(k) or {}
                crcs = e.get("chunk_crc32c")
                part = (
                    crcs[max(a - k * S, 0) // C : (min(b, (k + 1) * S) - 1 - k * S) // C + 1]
                    if crcs
                    else [e.get("crc32c")]
                )
                crc = crc32c.crc32c(repr((name, k, part)).encode(), crc)
        return f"{crc:08x}"

    def close(self) -> None:
        for fd, *_ in getattr(self, "_shards", {}).values():
            os.close(fd)
        if hasattr(self, "_shards"):
            self._shards.clear()

    def __del__(self) -> None:  # pragma: no cover
        try:
            if self._pid == os.getpid():
                self.close()
        except Exception:
            pass


class StoreDataset:  # a map-style dataset for torch's DataLoader (no torch import needed to define it)
    """Samples of one or more task stores, in store order. `ds[i]` -> dict of torch tensors.

    input_ids: int64 [T]; loss_mask: uint8 [T]; hidden_states: bfloat16 [T, L, H] where L follows
    `layer_ids` (default: every stored layer, in stored order); sample_id: str.
    """

    def __init__(
        self,
        stores: Sequence[TaskStore],
        counts: Sequence[int] | None = None,
        layer_ids: Sequence[int] | None = None,
        lengths: Sequence[Sequence[int]] | None = None,
    ):
        self.stores = list(stores)
        # Each store's sample lengths when the index gave them (so lengths() opens no store), else None.
        self._lengths = None if lengths is None else [np.asarray(x, dtype=np.int64) for x in lengths]
        counts = [len(s) for s in self.stores] if counts is None else list(counts)
        self._cum = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()
        self._layer_ids = None if layer_ids is None else [int(x) for x in layer_ids]
        self._positions: dict[int, list[int] | None] = {}

    def __len__(self) -> int:
        return int(self._cum[-1])

    def locate(self, i: int) -> tuple[int, int]:
        """Global sample index -> (store index, index within that store)."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range: the dataset has {n} samples")
        s = bisect.bisect_right(self._cum, i) - 1
        return s, i - int(self._cum[s])

    def _layer_positions(self, s: int) -> list[int] | None:
        if self._layer_ids is None:
            return None
        if s not in self._positions:
            stored = self.stores[s].layer_ids
            missing = [x for x in self._layer_ids if x not in stored]
            if missing:
                raise ValueError(f"layer ids {missing} are not in {self.stores[s].path} (it holds {stored})")
            self._positions[s] = [stored.index(x) for x in self._layer_ids]
        return self._positions[s]

    @property
    def layer_ids(self) -> list[int]:
        if self._layer_ids is not None:
            return self._layer_ids
        if not self.stores:
            raise StoreError(
                "this dataset has no task store, so no layer ids; aggregate a run whose "
                "extraction finished (`eagle-batch status RUN`)"
            )
        return list(self.stores[0].layer_ids)

    @property
    def spec(self) -> StoreSpec:
        """The first store's spec (an aggregated run's stores share it: aggregate checks their identity)."""
        if not self.stores:
            raise StoreError("this dataset has no task store, so no spec; aggregate a run whose extraction finished")
        store = self.stores[0]
        store._ensure()
        return store.spec

    def with_layers(self, layer_ids: Sequence[int]) -> "StoreDataset":
        """The same samples with only `layer_ids` (by layer id, in the given order)."""
        return StoreDataset(self.stores, np.diff(self._cum).tolist(), layer_ids, self._lengths)

    def lengths(self) -> np.ndarray:
        """Token count of every sample (reads only the committed records): for length-bucketed batching."""
        # Each store's first `count` samples: a store still being written may have committed more since.
        counts = np.diff(self._cum)
        per_store = self._lengths if self._lengths is not None else [s.lengths for s in self.stores]
        parts = [x[: int(c)] for x, c in zip(per_store, counts)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.get(i)

    def get_arrays(self, i: int, raw: bool = False) -> dict[str, Any]:
        """Sample i as numpy arrays: input_ids, loss_mask, hidden_states (bf16 as uint16 bits), sample_id; with
        `raw`, a float8 store's codes and hidden_states_scale instead (TaskStore.sample_arrays)."""
        s, j = self.locate(int(i))
        return self.stores[s].sample_arrays(j, self._layer_positions(s), raw)

    def get(self, i: int, raw: bool = False) -> dict[str, Any]:
        """Sample i as torch tensors (`ds[i]`); `raw` as for get_arrays."""
        s, j = self.locate(int(i))
        return self.stores[s].get(j, self._layer_positions(s), raw)

    def token_arrays(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, loss_mask) of sample i, without reading its hidden states."""
        s, j = self.locate(int(i))
        return self.stores[s].token_arrays(j)

    def sample_id(self, i: int) -> str:
        """The id of sample i (from the committed record; reads no array)."""
        s, j = self.locate(int(i))
        return self.stores[s].sample_ids[j]

    def sample_digest(self, i: int) -> str:
        """What sample i's stored bytes are, from the committed record alone (TaskStore.sample_digest)."""
        s, j = self.locate(int(i))
        return self.stores[s].sample_digest(j)

    def sources(self) -> dict[str, str]:
        """{store path: digest of the committed record read} of every store (provenance.record_digest)."""
        out = {}
        for s in self.stores:
            s._ensure()
            out[str(s.path)] = record_digest(s.record)
        return out

"""Read task stores and aggregated runs: `open_dataset(path)`.

    ds = open_dataset(RUN)                       # RUN/dataset.json (see aggregate) or one task store
    len(ds); x = ds[0]                           # {"input_ids", "loss_mask", "hidden_states", "sample_id"}
    aux = open_dataset(RUN, layer_ids=[2, 15, 27])  # only those layers (by layer id)
    ds.get_arrays(0, raw=True)                   # a float8 store's codes and scales, not dequantized

Hidden states come back as bf16 whatever the store's dtype: a float8 store's (float8_e4m3, float8_e5m2) are
dequantized (store/fp8.py); `raw=True` gives its uint8 codes and float32 row scales instead.

Everything comes from the committed record (`progress.json`), never from array shapes: a shape can
be ahead of the data after a crash and zarr reads the missing region as zeros. Shard files are read
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

import numpy as np

from .errors import ShardError, StoreCorruptError, StoreError, extract_then_aggregate
from .format import (
    COMPLETE_NAME,
    DATASET_NAME,
    PROGRESS_NAME,
    SCALE_ARRAY,
    load_json,
    read_attrs,
    read_layouts,
    task_stores,
)
from .fp8 import dequantize, float8
from .record import committed_samples, read_record, sample_bounds
from .shard_codec import ShardDecoder
from .spec import StoreSpec

MAX_OPEN_SHARDS = 64

# Re-exported: read_record (package API), read_attrs, read_layouts and DATASET_NAME (callers of this module).
__all__ = [
    "DATASET_NAME",
    "MAX_OPEN_SHARDS",
    "StoreDataset",
    "TaskStore",
    "open_dataset",
    "read_attrs",
    "read_layouts",
    "read_record",
]


class TaskStore:
    """Read-only view of one task store's committed samples. Picklable; opens files lazily per process."""

    def __init__(self, path: str | os.PathLike, *, metas: dict | None = None, attrs: dict | None = None):
        self.path = Path(path)
        self._metas = metas  # consolidated array metadata from dataset.json, if any
        self._attrs = attrs
        self._pid = None

    def __getstate__(self) -> dict:
        return {"path": self.path, "_metas": self._metas, "_attrs": self._attrs, "_pid": None}

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
        self._shards: OrderedDict[tuple[str, int], tuple[int, np.ndarray]] = OrderedDict()

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

    def _shard(self, name: str, k: int) -> tuple[int, np.ndarray]:
        key = (name, k)
        hit = self._shards.get(key)
        if hit is not None:
            self._shards.move_to_end(key)
            return hit
        lay = self.layouts[name]
        f = lay.shard_path(self.path, k)
        try:
            fd = os.open(f, os.O_RDONLY)
        except FileNotFoundError:
            raise StoreCorruptError(
                f"{f} is missing but the committed record covers it; run `eagle-batch verify {self.path}`."
            ) from None
        size = os.fstat(fd).st_size
        n = lay.index_nbytes()
        try:
            if size < n:
                raise ShardError(str(f), f"file is shorter ({size} bytes) than its shard index")
            index = self._decoders[name].index(os.pread(fd, n, size - n), str(f))
        except ShardError as e:
            os.close(fd)
            raise StoreCorruptError(f"{e}; run `eagle-batch verify {self.path}`.") from None
        self._shards[key] = (fd, index)
        if len(self._shards) > MAX_OPEN_SHARDS:
            old_fd, _ = self._shards.popitem(last=False)[1]
            os.close(old_fd)
        return fd, index

    def read_rows(self, name: str, start: int, stop: int, layers: Sequence[int] | None = None) -> np.ndarray:
        """Rows [start, stop) of a token array as stored (hidden_states: uint16 bits), optionally some layers
        (positions along axis 1)."""
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
            fd, index = self._shard(name, k)
            c0, c1 = (t - s0) // C, (e - 1 - s0) // C
            try:  # the shard's path is built on the error path only (this loop runs per chunk read)
                sel = dec.covered(index, c0, c1, "")
            except ShardError:
                raise StoreCorruptError(
                    f"{lay.shard_path(self.path, k)}: an inner chunk the committed record covers is absent; "
                    f"run `eagle-batch verify {self.path}`."
                ) from None
            first, last_end = int(sel[0, 0]), int(sel[-1, 0] + sel[-1, 1])
            contiguous = bool((sel[1:, 0] == sel[:-1, 0] + sel[:-1, 1]).all())
            blob = os.pread(fd, last_end - first, first) if contiguous else None
            for j, c in enumerate(range(c0, c1 + 1)):
                off, nb = int(sel[j, 0]), int(sel[j, 1])
                enc = blob[off - first : off - first + nb] if contiguous else os.pread(fd, nb, off)
                if len(enc) != nb:
                    raise StoreCorruptError(
                        f"{lay.shard_path(self.path, k)} is truncated; run `eagle-batch verify {self.path}`."
                    )
                try:
                    chunk = dec.chunk(enc, c, "")
                except ShardError as err:
                    raise StoreCorruptError(
                        f"{lay.shard_path(self.path, k)}: {err.detail}; run `eagle-batch verify {self.path}`."
                    ) from None
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
        out = {
            "input_ids": self.read_rows("input_ids", a, b),
            "loss_mask": self.read_rows("loss_mask", a, b),
            "hidden_states": self.read_rows("hidden_states", a, b, layers),
            "sample_id": self.sample_ids[i],
        }
        if SCALE_ARRAY in self.layouts:
            scales = self.read_rows(SCALE_ARRAY, a, b, layers)
            if raw:
                out[SCALE_ARRAY] = scales
            else:
                out["hidden_states"] = dequantize(out["hidden_states"], scales, float8(self.spec.dtype))
        return out

    def token_arrays(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, loss_mask) of sample i, without reading its hidden states."""
        self._ensure()
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        return self.read_rows("input_ids", a, b), self.read_rows("loss_mask", a, b)

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

    def close(self) -> None:
        for fd, _ in getattr(self, "_shards", {}).values():
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
        if not self.stores:
            return np.zeros(0, np.int64)
        return np.concatenate(self._lengths if self._lengths is not None else [s.lengths for s in self.stores])

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


def open_dataset(path: str | os.PathLike, layer_ids: Sequence[int] | None = None) -> StoreDataset:
    """A task store (`.../task-00000.zarr`) or an aggregated run directory (`RUN/dataset.json`)."""
    p = Path(path)
    if p.is_file() and p.name == DATASET_NAME:
        p = p.parent
    if (p / DATASET_NAME).is_file():
        index = load_json(p / DATASET_NAME, "the aggregate index; rerun `eagle-batch aggregate`")
        present = {str(s.relative_to(p)) for s in task_stores(p)}  # one directory read, not a stat per store
        stores, counts, lengths = [], [], []
        for entry in index["stores"]:
            if entry["path"] not in present and not (p / entry["path"]).is_dir():
                raise StoreError(
                    f"{p / DATASET_NAME} lists {entry['path']}, which no longer exists (deleted or moved?): "
                    f"`eagle-batch resume {p}` extracts its task again; then rerun `eagle-batch aggregate {p}`."
                )
            stores.append(
                TaskStore(
                    p / entry["path"],
                    metas=entry.get("arrays") or index.get("arrays") or None,
                    attrs=index.get("attributes"),
                )
            )
            counts.append(int(entry["num_samples"]))
            lengths.append(entry.get("lengths"))
        # The index's lengths (aggregate copies them from each store's marker) spare the batch plan a read of
        # every store's record; an index without them (an older aggregate) reads the records when asked.
        known = all(isinstance(x, list) and len(x) == n for x, n in zip(lengths, counts))
        return StoreDataset(stores, counts, layer_ids, lengths if known else None)
    if (p / PROGRESS_NAME).is_file():
        return StoreDataset([TaskStore(p)], None, layer_ids)
    extract = extract_then_aggregate(p)
    if (p / "stores").is_dir():
        stores = task_stores(p)
        if not stores:
            raise StoreError(f"{p} is a run directory whose stores/ holds no task store yet: {extract}.")
        # Not "run aggregate" when there is nothing to aggregate: aggregate refuses an index over nothing.
        if not any(committed_samples(s) for s in stores):
            raise StoreError(
                f"{p} holds no committed samples (its {len(stores)} task store(s) are empty; no {DATASET_NAME}): "
                f"nothing was extracted. Check `eagle-batch status {p}` (did extraction run and finish? was the "
                f"prepared data empty? see {p}/prepared/summary.json)."
            )
        raise StoreError(f"{p} is a run directory without {DATASET_NAME}; run `eagle-batch aggregate {p}` first.")
    if (p / "prepared").is_dir() or (p / "config.yaml").is_file():
        raise StoreError(
            f"{p} is a run directory with nothing extracted yet, so not a task store nor an aggregated run "
            f"(no stores/, no {DATASET_NAME}): {extract}."
        )
    if not p.exists():
        raise StoreError(f"{p} does not exist; give an aggregated run directory or a task store.")
    raise StoreError(
        f"{p} is neither a task store (no {PROGRESS_NAME}) nor an aggregated run (no {DATASET_NAME}); give a run "
        "directory (after `eagle-batch aggregate RUN`) or a task store (RUN/stores/task-00000.zarr)."
    )

"""A store's complete state: finalize() writes it, the recovery of a store that takes more samples undoes it.

A complete store has `offsets` and `sample_ids` (zarr arrays for readers without eagle-batch), its array
metadata consolidated into the root `zarr.json`, and the `complete` marker, written last: the marker's
presence means everything before it is on disk. Undoing it goes in the reverse order, marker first, so a
crash in between never leaves a marker over index arrays that no longer match the record.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

import numpy as np

from .crc import sealed
from .durable import fsync_dir, fsync_tree, write_json_atomic
from .format import COMPLETE_NAME, INDEX_ARRAYS
from .provenance import record_digest
from .record import read_record


def finalize_store(store: Path, sample_ids: list[str], lengths: list[int], commit: int, fsync: bool) -> None:
    """Write offsets, sample_ids and consolidated metadata, sync them, then (last) the `complete` marker.
    The caller has committed every sample it passes."""
    import zarr

    with warnings.catch_warnings():
        # zarr notes our non-Zarr files (progress.json, .lock) and that consolidation is not in the v3 spec.
        warnings.filterwarnings("ignore", message=".*(not recognized as a component|Consolidated metadata).*")
        _write_index_arrays(zarr, store, sample_ids, lengths)
    if fsync:
        for d in INDEX_ARRAYS:
            fsync_tree(store / d)
        fsync_dir(store)
    # Sealed (crc.sealed): aggregate trusts what the marker says of the store only after checking its crc32c;
    # "record" is the digest of the committed record it completes (provenance.record_digest).
    write_json_atomic(
        store / COMPLETE_NAME,
        sealed(
            {
                "num_samples": len(sample_ids),
                "num_tokens": int(sum(lengths)),
                "commit": commit,
                "record": record_digest(read_record(store)),
                "finalized_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **marker_summary(store, lengths),
            }
        ),
        fsync,
    )


def marker_summary(store: Path, lengths: list[int]) -> dict:
    """What `aggregate` and the training loader need of a complete store, in its one small marker file: the
    group's eagle_batch attributes, each array's metadata less its shape, and every sample's length. An
    aggregate of N stores then reads one file per store, and opening the aggregated run reads none (on a
    parallel file system each file opened is a round trip to the metadata server)."""
    root_meta = json.loads((store / "zarr.json").read_bytes())
    consolidated = (root_meta.get("consolidated_metadata") or {}).get("metadata") or {}
    return {
        "attributes": root_meta.get("attributes", {}).get("eagle_batch", {}),
        "arrays": {
            name: {k: v for k, v in meta.items() if k != "shape"}
            for name, meta in consolidated.items()
            if name not in INDEX_ARRAYS
        },
        "lengths": [int(n) for n in lengths],
    }


def _write_index_arrays(zarr, store: Path, sample_ids: list[str], lengths: list[int]) -> None:
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    root = zarr.open_group(store, mode="r+", zarr_format=3)
    a = root.create_array(
        "offsets",
        shape=offsets.shape,
        dtype="int64",
        chunks=(max(1, min(len(offsets), 1 << 18)),),
        compressors=None,
        overwrite=True,
    )
    a[:] = offsets
    ids = np.array(sample_ids, dtype=object)
    s = root.create_array(
        "sample_ids", shape=ids.shape, dtype=str, chunks=(max(1, min(len(ids), 1 << 16)),), overwrite=True
    )
    if len(ids):
        s[:] = ids
    zarr.consolidate_metadata(store, zarr_format=3)


def unfinalize(store: Path, fsync: bool) -> None:
    """Undo finalize(), or the part of it an interrupted finalize() did: the marker (synced away first),
    then `offsets`/`sample_ids` and the consolidated metadata, which describe the state being left."""
    marker = store / COMPLETE_NAME
    if marker.is_file():
        marker.unlink()
        if fsync:
            fsync_dir(store)
    for name in INDEX_ARRAYS:
        if (store / name).exists():
            shutil.rmtree(store / name)
    root_meta = json.loads((store / "zarr.json").read_bytes())
    if root_meta.pop("consolidated_metadata", None) is not None:
        write_json_atomic(store / "zarr.json", root_meta, fsync)

"""aggregate(run_dir): RUN/dataset.json, a zero-copy index over the complete task stores of a run.

Nothing is copied: the index lists each complete store (relative path, samples, tokens, where its
samples start globally) plus consolidated metadata (the common group attributes and each store's
array metadata), so `open_dataset(RUN)` knows every length without opening a store and a reader
opens each store's files only when it first reads from it. Array metadata is stored once (without
shapes, which readers never use) unless a store differs. Incomplete stores are listed separately
with their committed sample counts. Stores must agree on layer ids, hidden size, dtype, model and
config hash; a mismatch names both stores.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from .durable import write_json_atomic
from .errors import StoreError, StoreMismatchError
from .format import COMPLETE_NAME, DATASET_NAME, read_attrs, token_arrays
from .record import committed_samples
from .spec import StoreSpec

INDEX_FORMAT = "eagle-batch-dataset"


def aggregate(run_dir, *, fsync: bool = True, each: Callable[[list[Path]], Iterable[Path]] = iter) -> dict:
    """Write RUN/dataset.json over RUN/stores/*.zarr; return the index (also lists incomplete stores).
    `each` wraps the list of stores (a progress bar)."""
    run = Path(run_dir)
    root = run / "stores"
    if not root.is_dir():
        raise StoreError(
            f"{root} does not exist: {run} is not a run directory with extracted stores "
            "(run `eagle-batch extract` first)."
        )
    entries, incomplete = [], []
    common: dict | None = None
    common_layout: dict | None = None
    first: Path | None = None
    samples = tokens = 0
    for store in each(sorted(p for p in root.iterdir() if p.name.endswith(".zarr") and p.is_dir())):
        rel = str(store.relative_to(run))
        try:
            done = json.loads((store / COMPLETE_NAME).read_bytes())
        except FileNotFoundError:
            incomplete.append({"path": rel, "committed_samples": committed_samples(store)})
            continue
        root_meta = json.loads((store / "zarr.json").read_bytes())
        attrs = root_meta.get("attributes", {}).get("eagle_batch") or read_attrs(store)  # read_attrs names the problem
        if common is None:
            common, first = attrs, store
        else:
            bad = StoreSpec.from_attributes(attrs).mismatches(StoreSpec.from_attributes(common))
            if bad:
                raise StoreMismatchError(
                    f"{store} and {first} were extracted differently: "
                    + "; ".join(bad)
                    + ". A run's stores must come from one model and config; re-extract the odd ones."
                )
        # finalize() consolidated the array metadata into the root zarr.json: 2 small reads per store.
        consolidated = (root_meta.get("consolidated_metadata") or {}).get("metadata") or {}
        names = token_arrays(StoreSpec.from_attributes(attrs).dtype)
        arrays = {n: consolidated.get(n) or json.loads((store / n / "zarr.json").read_bytes()) for n in names}
        layout = {n: {k: v for k, v in m.items() if k != "shape"} for n, m in arrays.items()}
        if common_layout is None:
            common_layout = layout
        entry = {
            "path": rel,
            "num_samples": int(done["num_samples"]),
            "num_tokens": int(done["num_tokens"]),
            "sample_start": samples,
            "token_start": tokens,
        }
        if layout != common_layout:  # e.g. a store written with another codec: keep its own metadata
            entry["arrays"] = layout
        entries.append(entry)
        samples += int(done["num_samples"])
        tokens += int(done["num_tokens"])
    index = {
        "format": INDEX_FORMAT,
        "format_version": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "num_samples": samples,
        "num_tokens": tokens,
        "attributes": common or {},
        "arrays": common_layout or {},  # array metadata (less shape) shared by the stores without their own
        "stores": entries,
        "incomplete": incomplete,
    }
    write_json_atomic(run / DATASET_NAME, index, fsync)
    return index

"""aggregate(run_dir): RUN/dataset.json, a zero-copy index over the complete task stores of a run.

Nothing is copied: the index lists each complete store (relative path, samples, tokens, where its
samples start globally, the digest of the committed record it was made from: provenance.py) plus consolidated metadata (the common group attributes and each store's
array metadata), so `open_dataset(RUN)` knows every length without opening a store and a reader
opens each store's files only when it first reads from it. Array metadata is stored once (without
shapes, which readers never use) unless a store differs. Incomplete stores are listed separately
with their committed sample counts. Stores must agree on layer ids, hidden size, dtype, model and
config hash; a mismatch names both stores.

The index is sealed (crc.sealed: the crc32c of its own content; open_dataset checks it). Every check comes
before the one write: a damaged store file, no complete store, or complete stores that
hold no sample raise a StoreError and leave an existing dataset.json as it was (an index over nothing
would let `train` start on nothing, and replacing a good index with it would lose the only view of the run).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .crc import seal_problem, sealed
from .durable import write_json_atomic
from .errors import StoreCorruptError, StoreError, StoreMismatchError, extract_then_aggregate
from .format import COMPLETE_NAME, DATASET_NAME, read_attrs, task_stores, token_arrays
from .provenance import record_digest
from .record import committed_samples, read_record
from .spec import StoreSpec

INDEX_FORMAT = "eagle-batch-dataset"


def _store_json(path: Path, run: Path, what: str, missing_ok: bool = False) -> Any:
    """A JSON file of a complete store; missing (unless `missing_ok`: None) or damaged, a StoreCorruptError
    naming it and what to do."""
    try:
        obj = json.loads(path.read_bytes())
        if isinstance(obj, dict):
            return obj
        problem = f"is damaged (a JSON {type(obj).__name__}, not an object)"
    except FileNotFoundError:
        if missing_ok:
            return None
        problem = "is missing"
    except ValueError as e:
        problem = f"is damaged (not valid JSON: {e})"
    raise StoreCorruptError(
        f"{path} {problem} ({what}); run `eagle-batch verify {run}` to see everything that is wrong, then "
        f"`eagle-batch resume {run}` (with --repair for damaged shards) or delete that store and extract its "
        f"task again. Nothing was written: {run / DATASET_NAME} is as it was."
    )


def _marker(store: Path, run: Path) -> dict | None:
    """The store's `complete` marker (None when the store is not complete): one read, no stat first."""
    done = _store_json(store / COMPLETE_NAME, run, "the marker finalize() writes", missing_ok=True)
    problem = seal_problem(done) if isinstance(done, dict) else None
    if problem:
        raise StoreCorruptError(
            f"{store / COMPLETE_NAME} is damaged: {problem}; run `eagle-batch verify {run}`, then "
            f"`eagle-batch resume {run}` to finalize the store again. Nothing was written."
        )
    return done


def _store_summary(store: Path, run: Path, done: dict) -> tuple[dict, dict, list[int] | None]:
    """(eagle_batch attributes, token arrays' metadata less shape, sample lengths or None) of a complete store:
    from its marker (finalize writes them there), else (a store finalized by an older eagle-batch) from its
    root zarr.json, whose consolidated metadata finalize() wrote."""
    attrs, arrays, lengths = done.get("attributes"), done.get("arrays"), done.get("lengths")
    # A copy whose own seal fails is not used: the store's zarr.json (read_attrs names its problem) decides.
    if (
        isinstance(attrs, dict)
        and attrs
        and not seal_problem(attrs)
        and isinstance(arrays, dict)
        and isinstance(lengths, list)
    ):
        names = token_arrays(str(attrs.get("dtype", "bfloat16")))
        if all(n in arrays for n in names):
            return attrs, {n: arrays[n] for n in names}, [int(x) for x in lengths]
    root_meta = _store_json(store / "zarr.json", run, "the store's root group metadata")
    attrs = root_meta.get("attributes", {}).get("eagle_batch") or read_attrs(store)  # read_attrs names the problem
    consolidated = (root_meta.get("consolidated_metadata") or {}).get("metadata") or {}
    names = token_arrays(StoreSpec.from_attributes(attrs).dtype)
    metas = {
        n: consolidated.get(n) or _store_json(store / n / "zarr.json", run, f"metadata of array {n}") for n in names
    }
    return attrs, {n: {k: v for k, v in m.items() if k != "shape"} for n, m in metas.items()}, None


def previous_index(run_dir) -> dict | None:
    """RUN/dataset.json as it is now (None if absent or unreadable): to say what a new index leaves out."""
    try:
        index = json.loads((Path(run_dir) / DATASET_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    return index if isinstance(index, dict) and isinstance(index.get("stores"), list) else None


def left_out(previous: dict | None, index: dict) -> list[str]:
    """Stores the previous index listed that `index` does not, each with why (for a warning)."""
    if not previous:
        return []
    now = {e["path"] for e in index["stores"]}
    incomplete = {e["path"]: e["committed_samples"] for e in index["incomplete"]}
    out = []
    for e in previous["stores"]:
        path = e.get("path") if isinstance(e, dict) else None
        if not path or path in now:
            continue
        why = f"no longer complete ({incomplete[path]} samples committed)" if path in incomplete else "no longer exists"
        out.append(f"{path} ({e.get('num_samples')} samples) {why}")
    return out


def not_indexed(run_dir) -> list[str]:
    """Complete task stores of RUN that RUN/dataset.json does not list (finished since it was written): a
    training on the index would leave them out. Empty when there is no readable index."""
    run = Path(run_dir)
    index = previous_index(run)
    if index is None:
        return []
    listed = {e.get("path") for e in index["stores"] if isinstance(e, dict)}
    # The stat only for stores the index does not list: one directory read for the rest.
    return [
        str(p.relative_to(run))
        for p in task_stores(run)
        if str(p.relative_to(run)) not in listed and (p / COMPLETE_NAME).exists()
    ]


def aggregate(run_dir, *, fsync: bool = True, each: Callable[[list[Path]], Iterable[Path]] = iter) -> dict:
    """Write RUN/dataset.json over RUN/stores/*.zarr; return the index (also lists incomplete stores).
    `each` wraps the list of stores (a progress bar)."""
    run = Path(run_dir)
    root = run / "stores"
    if not root.is_dir():
        raise StoreError(
            f"{root} does not exist: {run} is not a run directory with extracted stores; run "
            f"`eagle-batch extract CONFIG` first (`eagle-batch status {run}` shows where a run stands)."
        )
    entries, incomplete = [], []
    common: dict | None = None
    common_layout: dict | None = None
    first: Path | None = None
    samples = tokens = 0
    stores = task_stores(run)
    for store in each(stores):
        rel = f"stores/{store.name}"
        done = _marker(store, run)  # one read per complete store (the marker holds what the index needs)
        if done is None:
            incomplete.append({"path": rel, "committed_samples": committed_samples(store)})
            continue
        attrs, layout, lengths = _store_summary(store, run, done)
        if common is None:
            common, first = attrs, store
        elif attrs != common:  # equal attributes cannot mismatch: the specs are built only for those that differ
            bad = StoreSpec.from_attributes(attrs).mismatches(StoreSpec.from_attributes(common))
            if bad:
                raise StoreMismatchError(
                    f"{store} and {first} were extracted differently: "
                    + "; ".join(bad)
                    + ". A run's stores must come from one model and config; re-extract the odd ones."
                )
        if common_layout is None:
            common_layout = layout
        try:
            n_samples, n_tokens = int(done["num_samples"]), int(done["num_tokens"])
            if lengths is not None and (len(lengths) != n_samples or sum(lengths) != n_tokens):
                raise ValueError("lengths")
        except (KeyError, TypeError, ValueError):
            raise StoreCorruptError(
                f"{store / COMPLETE_NAME} has no valid num_samples / num_tokens / lengths; run `eagle-batch verify "
                f"{run}`, then `eagle-batch resume {run}` to finalize the store again. Nothing was written."
            ) from None
        entry = {
            "path": rel,
            "num_samples": n_samples,
            "num_tokens": n_tokens,
            "sample_start": samples,
            "token_start": tokens,
            # The marker's copy of the record digest (one read per store); a marker written before it had one:
            # the record itself.
            "record": done.get("record") or _record_digest(store, run, n_samples),
        }
        if layout != common_layout:  # e.g. a store written with another codec: keep its own metadata
            entry["arrays"] = layout
        if lengths is not None:  # every sample's length: the loader's batch plan opens no store for them
            entry["lengths"] = lengths
        entries.append(entry)
        samples += n_samples
        tokens += n_tokens
    _check_not_empty(run, root, stores, entries, incomplete)
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
    write_json_atomic(run / DATASET_NAME, sealed(index), fsync)
    return index


def _record_digest(store: Path, run: Path, n_samples: int) -> str:
    """The digest of the store's committed record (its seal checked), which must hold `n_samples`."""
    record = read_record(store)
    if record["num_samples"] != n_samples:
        raise StoreCorruptError(
            f"{store}: its complete marker says {n_samples} samples, its committed record "
            f"{record['num_samples']}; run `eagle-batch verify {run}`, then `eagle-batch resume {run}`. "
            "Nothing was written."
        )
    return record_digest(record)


def _check_not_empty(run: Path, root: Path, stores: list[Path], entries: list[dict], incomplete: list[dict]) -> None:
    """StoreError unless the index would list at least one sample (checked before anything is written)."""
    kept = f" {run / DATASET_NAME} was left as it was." if (run / DATASET_NAME).exists() else ""
    if not stores:
        raise StoreError(
            f"{root} holds no task store: nothing has been extracted yet: {extract_then_aggregate(run)}.{kept}"
        )
    if not entries:
        committed = sum(e["committed_samples"] for e in incomplete)
        raise StoreError(
            f"no complete task store under {root}: its {len(incomplete)} store(s) are unfinished ({committed} "
            f"samples committed so far). Finish them with `eagle-batch resume {run}` (see `eagle-batch status "
            f"{run}`), then aggregate again.{kept}"
        )
    if not any(e["num_samples"] for e in entries):
        raise StoreError(
            f"the {len(entries)} complete task store(s) under {root} hold no samples: nothing was extracted "
            f"(was the prepared data empty? see {run}/prepared/summary.json).{kept}"
        )

"""`open_dataset(path)`: a task store or an aggregated run (RUN/dataset.json, its seal checked) as a
`StoreDataset` (reader.py); anything else is a StoreError that says what the path is and what to run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .crc import seal_problem
from .errors import StoreCorruptError, StoreError, extract_then_aggregate
from .format import DATASET_NAME, PROGRESS_NAME, load_json, task_stores
from .reader import StoreDataset, TaskStore
from .record import committed_samples


def open_dataset(
    path: str | os.PathLike, layer_ids: Sequence[int] | None = None, *, check_chunks: bool = True
) -> StoreDataset:
    """A task store (`.../task-00000.zarr`) or an aggregated run directory (`RUN/dataset.json`).
    `check_chunks=False` reads chunks without their crc32c check: only for measuring what the check costs
    (`eagle-batch bench loader`); every command reads with it."""
    p = Path(path)
    if p.is_file() and p.name == DATASET_NAME:
        p = p.parent
    if (p / DATASET_NAME).is_file():
        index = load_json(p / DATASET_NAME, "the aggregate index; rerun `eagle-batch aggregate`")
        problem = seal_problem(index) if isinstance(index, dict) else "it is not a JSON object"
        if problem:
            raise StoreCorruptError(f"{p / DATASET_NAME} is damaged: {problem}; rerun `eagle-batch aggregate {p}`.")
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
                    check_chunks=check_chunks,
                )
            )
            counts.append(int(entry["num_samples"]))
            lengths.append(entry.get("lengths"))
        # The index's lengths (aggregate copies them from each store's marker) spare the batch plan a read of
        # every store's record; an index without them (an older aggregate) reads the records when asked.
        known = all(isinstance(x, list) and len(x) == n for x, n in zip(lengths, counts))
        return StoreDataset(stores, counts, layer_ids, lengths if known else None)
    if (p / PROGRESS_NAME).is_file():
        return StoreDataset([TaskStore(p, check_chunks=check_chunks)], None, layer_ids)
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

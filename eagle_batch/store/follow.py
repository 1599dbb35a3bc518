"""A run's task stores while extraction still writes them: what pipelined training (`train.follow`) reads.

    stores = RunStores(RUN, num_tasks=64)
    snap = stores.snapshot()                 # which samples are committed now (reads each store's record)
    ids, lengths = stores.ids_and_lengths(snap)
    stores.get_arrays(int(ids[0]))           # one committed sample, as StoreDataset.get_arrays

Invariants:
- A sample's id is stable while the run grows: `task_id << ID_BITS | j` for the j-th sample of task store
  `task_id`. Ids never move when another store commits more.
- Only committed samples are ever addressed: a snapshot holds, per task store, the number of samples its
  committed record (`progress.json`, replaced atomically) listed when it was taken. Commits only append, so
  samples `0 .. count-1` of that store are exactly the ones the snapshot saw, whenever they are read later.
- Every store a snapshot includes has the first store's layer ids, hidden size and dtype (StoreError
  otherwise), as `aggregate` requires of the stores it indexes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import StoreError
from .format import COMPLETE_NAME, PROGRESS_NAME, read_attrs
from .provenance import record_digest
from .reader import StoreDataset, TaskStore
from .record import read_record
from .spec import StoreSpec

ID_BITS = 32
_LOCAL = (1 << ID_BITS) - 1


def sample_id_of(task_id: int, j: int) -> int:
    """The stable global id of sample j of task store task_id."""
    return (int(task_id) << ID_BITS) | int(j)


def split_id(gid: int) -> tuple[int, int]:
    """(task id, position in that task's store) of a global id."""
    return int(gid) >> ID_BITS, int(gid) & _LOCAL


@dataclass(frozen=True)
class CommitSnapshot:
    """Which samples of a run were committed at one moment: `counts[task_id]` samples of each task store (a
    prefix of it), `complete` of `num_tasks` stores finished."""

    counts: dict[int, int]
    complete: int
    num_tasks: int
    taken_at: float = field(default=0.0, compare=False)

    @property
    def num_samples(self) -> int:
        return sum(self.counts.values())

    @property
    def extraction_done(self) -> bool:
        """Every task's store is complete: later snapshots will hold nothing new."""
        return self.complete >= self.num_tasks

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": {str(t): int(n) for t, n in sorted(self.counts.items())},
            "complete": int(self.complete),
            "num_tasks": int(self.num_tasks),
            "taken_at": float(self.taken_at),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CommitSnapshot:
        return cls(
            {int(t): int(n) for t, n in d["counts"].items()},
            int(d["complete"]),
            int(d["num_tasks"]),
            float(d.get("taken_at", 0.0)),
        )


def _spec_key(spec: StoreSpec) -> tuple:
    return (tuple(spec.layer_ids), spec.hidden_size, spec.dtype)


class RunStores:
    """The task stores of RUN (`RUN/stores/task-NNNNN.zarr`, task ids 0 .. num_tasks-1) as one growing
    dataset addressed by stable global ids. Picklable: a DataLoader worker opens its own stores."""

    def __init__(self, run_dir: str | os.PathLike, num_tasks: int, layer_ids: list[int] | None = None):
        if num_tasks < 1:
            raise StoreError(f"{run_dir}: a run of {num_tasks} tasks has no task store to follow")
        self.run_dir = Path(run_dir)
        self.num_tasks = int(num_tasks)
        self._layer_ids = layer_ids
        self._spec: tuple | None = None
        self._checked: set[int] = set()
        self._open: dict[int, TaskStore] = {}
        self._latest: CommitSnapshot | None = None
        self._digests: dict[int, str] = {}  # task id -> digest of the record its last snapshot read

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"] = {}
        return state

    def store_path(self, task_id: int) -> Path:
        return self.run_dir / "stores" / f"task-{task_id:05d}.zarr"

    # ----- snapshots (the main process) -----

    def snapshot(self) -> CommitSnapshot:
        """The committed samples of every task store now: one read of each existing store's record."""
        counts: dict[int, int] = {}
        complete = 0
        for t in range(self.num_tasks):
            path = self.store_path(t)
            if not (path / PROGRESS_NAME).is_file():
                continue
            record = read_record(path)
            n = int(record["num_samples"])
            if n:
                self._check_spec(t)
                counts[t] = n
                self._digests[t] = record_digest(record)
            complete += (path / COMPLETE_NAME).is_file()
        self._latest = CommitSnapshot(counts, complete, self.num_tasks, time.time())
        return self._latest

    def _check_spec(self, task_id: int) -> None:
        if task_id in self._checked:
            return
        spec = StoreSpec.from_attributes(read_attrs(self.store_path(task_id)))
        key = _spec_key(spec)
        if self._spec is None:
            self._spec = key
        elif key != self._spec:
            raise StoreError(
                f"{self.store_path(task_id)} holds layers {key[0]}, hidden size {key[1]}, {key[2]}; the run's other "
                f"stores hold {self._spec[0]}, {self._spec[1]}, {self._spec[2]}: a run's tasks must share the model "
                "and store settings (was RUN/config.yaml changed between extract and resume?)"
            )
        self._checked.add(task_id)

    def ids_and_lengths(self, snap: CommitSnapshot) -> tuple[np.ndarray, np.ndarray]:
        """The global ids of the snapshot's samples (task order, then store order) and their token counts."""
        ids, lengths = [], []
        for t, n in sorted(snap.counts.items()):
            rec = read_record(self.store_path(t))
            if int(rec["num_samples"]) < n:
                raise StoreError(
                    f"{self.store_path(t)} now commits {rec['num_samples']} samples, fewer than the {n} it had "
                    "committed before: its record was rewritten (a store replaced by hand?). Committed samples "
                    "never disappear; check the run with `eagle-batch verify`."
                )
            ids.append((np.int64(t) << ID_BITS) | np.arange(n, dtype=np.int64))
            lengths.append(np.asarray(rec["lengths"][:n], dtype=np.int64))
        if not ids:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(ids), np.concatenate(lengths)

    def view(self, snap: CommitSnapshot) -> StoreDataset:
        """The snapshot's samples as a StoreDataset (indexes 0..n-1 in ids_and_lengths' order)."""
        tasks = sorted(snap.counts)
        return StoreDataset([TaskStore(self.store_path(t)) for t in tasks], [snap.counts[t] for t in tasks])

    # ----- samples (any process) -----

    @property
    def layer_ids(self) -> list[int]:
        if self._layer_ids is not None:
            return list(self._layer_ids)
        for t in range(self.num_tasks):
            if (self.store_path(t) / PROGRESS_NAME).is_file():
                return list(StoreSpec.from_attributes(read_attrs(self.store_path(t))).layer_ids)
        raise StoreError(f"{self.run_dir}/stores holds no task store yet: nothing is extracted to train on")

    def __len__(self) -> int:
        """Samples of the latest snapshot this object took (0 before the first)."""
        return self._latest.num_samples if self._latest else 0

    def lengths(self) -> np.ndarray:
        """Token counts of the latest snapshot's samples."""
        return self.ids_and_lengths(self._latest)[1] if self._latest else np.zeros(0, np.int64)

    def _store(self, gid: int) -> tuple[TaskStore, int]:
        t, j = split_id(gid)
        st = self._open.get(t)
        if st is None or j >= len(st):  # a store opened before it committed sample j: read its record again
            if st is not None:
                st.close()
            st = self._open[t] = TaskStore(self.store_path(t))
            if j >= len(st):
                raise StoreError(
                    f"{self.store_path(t)}: sample {j} is not committed (the record lists {len(st)}); a "
                    "pipelined trainer reads only committed samples, so the store's record went back"
                )
        return st, j

    def get_arrays(self, gid: int, raw: bool = False) -> dict[str, Any]:
        st, j = self._store(gid)
        return st.sample_arrays(j, None, raw)

    def token_arrays(self, gid: int) -> tuple[np.ndarray, np.ndarray]:
        st, j = self._store(gid)
        return st.token_arrays(j)

    def sources(self) -> dict[str, str]:
        """{store path: digest of the committed record the latest snapshot read} (store/provenance.py)."""
        return {str(self.store_path(t)): d for t, d in sorted(self._digests.items())}

    def sample_id(self, gid: int) -> str:
        st, j = self._store(gid)
        return st.sample_ids[j]

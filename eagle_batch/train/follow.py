"""Pipelined training (`train.follow`): batches over the samples committed so far while extraction still runs.

    plan = FollowPlan(RunStores(RUN, num_tasks), out_dir, rank, world, tc)
    plan.epoch_snapshot(0)                     # waits for the first committed samples (train.follow_start_*)
    EpochLoader(samples, plan, rank).stream()  # plan.rank_batches(epoch, rank), as a BatchPlan's

Invariants:
- An epoch is defined over the snapshot of committed samples taken when it begins (store.follow): its batches
  are a BatchPlan over exactly those samples, so no sample is read twice in one epoch, and no sample that was
  not committed is ever read. Once extraction has finished, every later epoch is the whole dataset.
- Rank 0 takes each epoch's snapshot and writes it to OUT/follow/epoch-NNNNNN.json (atomically) before any
  rank plans that epoch; the other ranks read that file, so every rank plans the same batches. A resumed
  trainer reads the file of the epoch it stopped in (or the copy in its checkpoint) and rebuilds the same
  plan: it continues bit-identically.
- Held-out samples (train.holdout_fraction, chosen by a hash of the sample id: the same in every snapshot and
  in a run trained after extraction) are never planned.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from eagle_batch.store.durable import write_json_atomic
from eagle_batch.store.follow import CommitSnapshot, RunStores

from .data import BatchPlan, trained_lengths

FOLLOW_DIR = "follow"
HOLDOUT_BUCKETS = 10_000


def is_heldout(sample_id: str, fraction: float) -> bool:
    """Whether a sample is held out of training (its crc32 bucket below `fraction`): stable across runs."""
    return fraction > 0 and zlib.crc32(sample_id.encode()) % HOLDOUT_BUCKETS < fraction * HOLDOUT_BUCKETS


class TrainSubset:
    """A BatchPlan over a subset of a dataset's indices (`ids[p]` for the plan's position p)."""

    def __init__(self, plan: BatchPlan, ids: np.ndarray):
        self.plan, self.ids = plan, np.asarray(ids, dtype=np.int64)

    def rank_batches(self, epoch: int, rank: int) -> list[list[int]]:
        return [[int(self.ids[p]) for p in b] for b in self.plan.rank_batches(epoch, rank)]

    def steps_per_epoch(self) -> int:
        return self.plan.steps_per_epoch()


class FollowPlan:
    """This rank's batches of each epoch over the samples committed when the epoch began."""

    def __init__(self, stores: RunStores, out: Path, rank: int, world: int, tc, note: Callable[[str], None] = print):
        self.stores, self.dir, self.rank, self.world, self.tc = stores, Path(out) / FOLLOW_DIR, rank, world, tc
        self.note = note
        self.on_snapshot: Callable[[dict], None] = lambda rec: None  # set by the trainer (metrics.jsonl)
        self._plans: dict[int, TrainSubset] = {}
        self._snaps: dict[int, CommitSnapshot] = {}

    def _file(self, epoch: int) -> Path:
        return self.dir / f"epoch-{epoch:06d}.json"

    def restore(self, epoch: int, snap: dict) -> None:
        """A checkpoint's snapshot of `epoch` (its file may be gone): the plan of that epoch is rebuilt from it."""
        self._snaps[epoch] = CommitSnapshot.from_json(snap)

    def epoch_snapshot(self, epoch: int) -> CommitSnapshot:
        """The snapshot that defines `epoch`: recorded, or (rank 0) taken now, waiting until there is enough."""
        if epoch in self._snaps:
            return self._snaps[epoch]
        f = self._file(epoch)
        if not f.is_file():
            if self.rank == 0:
                snap = self._wait_for_data(epoch)
                self.dir.mkdir(parents=True, exist_ok=True)
                write_json_atomic(f, snap.to_json(), fsync=False)
                for old in self.dir.glob("epoch-*.json"):  # a resume needs only its own epoch's (and has a copy)
                    if old.name < self._file(epoch - 1).name:
                        old.unlink(missing_ok=True)
            else:
                self._wait_for_file(f)
        snap = CommitSnapshot.from_json(json.loads(f.read_text()))
        self._snaps = {e: s for e, s in self._snaps.items() if e >= epoch - 1}
        self._snaps[epoch] = snap
        return snap

    def rank_batches(self, epoch: int, rank: int) -> list[list[int]]:
        plan = self._plans.get(epoch)
        if plan is None:
            snap = self.epoch_snapshot(epoch)
            plan = self._plans[epoch] = self._subset(snap, epoch)
            self._plans = {e: p for e, p in self._plans.items() if e >= epoch - 1}
        return plan.rank_batches(epoch, rank)

    def steps_per_epoch(self) -> int:
        last = max(self._plans) if self._plans else None
        return self._plans[last].steps_per_epoch() if last is not None else 0

    def _subset(self, snap: CommitSnapshot, epoch: int | None = None) -> TrainSubset:
        ids, lengths = self.training_samples(snap)
        tc = self.tc
        lengths = trained_lengths(lengths, tc.max_length)
        subset = TrainSubset(BatchPlan(lengths, tc.batch_tokens, tc.seed, self.world), ids)
        if epoch is not None and self.rank == 0:
            rec = {
                "event": "snapshot",
                "epoch": epoch,
                "samples": int(len(ids)),
                "tokens": int(lengths.sum()),
                "tasks_with_samples": len(snap.counts),
                "tasks_complete": snap.complete,
                "num_tasks": snap.num_tasks,
                "extraction_done": snap.extraction_done,
                "steps_in_epoch": subset.steps_per_epoch(),
            }
            self.note(
                f"epoch {epoch}: {rec['samples']} samples ({rec['tokens']:,} tokens) committed by "
                f"{rec['tasks_with_samples']} task(s), {snap.complete}/{snap.num_tasks} complete"
            )
            self.on_snapshot(rec)
        return subset

    def training_samples(self, snap: CommitSnapshot) -> tuple[np.ndarray, np.ndarray]:
        """(global ids, lengths) of the snapshot's samples that are not held out."""
        ids, lengths = self.stores.ids_and_lengths(snap)
        keep = ~self.heldout_mask(ids)
        return ids[keep], lengths[keep]

    def heldout_mask(self, ids: np.ndarray) -> np.ndarray:
        f = float(self.tc.holdout_fraction)
        if f <= 0:
            return np.zeros(len(ids), dtype=bool)
        return np.array([is_heldout(self.stores.sample_id(int(i)), f) for i in ids], dtype=bool)

    def _enough(self, snap: CommitSnapshot, epoch: int) -> bool:
        tc = self.tc
        if epoch == 0 and not snap.extraction_done:
            if snap.complete < tc.follow_start_fraction * snap.num_tasks or snap.num_samples < 1:
                return False
        ids, _ = self.training_samples(snap) if snap.num_samples else (np.zeros(0), None)
        if not len(ids):
            return False
        return len(self._subset(snap).plan.epoch_batches(epoch)) >= self.world

    def _wait_for_data(self, epoch: int) -> CommitSnapshot:
        """Rank 0: a snapshot with enough samples for every rank's first batch (and, for the first epoch,
        train.follow_start_fraction of the tasks complete); a StoreError after train.follow_timeout_s
        without a new commit, or when extraction ended with too few samples."""
        timeout = float(self.tc.follow_timeout_s)
        last_n, last_change, said = -1, time.time(), False
        while True:
            snap = self.stores.snapshot()
            if self._enough(snap, epoch):
                return snap
            if snap.extraction_done:
                from eagle_batch.store import StoreError

                raise StoreError(
                    f"{self.stores.run_dir}: extraction finished with {snap.num_samples} committed samples, too few "
                    f"for one batch of <= {self.tc.batch_tokens} tokens per rank ({self.world} rank(s)) after "
                    f"holding out train.holdout_fraction={self.tc.holdout_fraction}"
                )
            if snap.num_samples != last_n:
                last_n, last_change = snap.num_samples, time.time()
            elif timeout and time.time() - last_change > timeout:
                from eagle_batch.store import StoreError

                raise StoreError(
                    f"{self.stores.run_dir}: no new committed sample for {timeout:g} s (train.follow_timeout_s) "
                    f"and {snap.complete}/{snap.num_tasks} task stores complete: is the extraction running? "
                    f"Check `eagle-batch status {self.stores.run_dir}`."
                )
            if not said:
                self.note(
                    f"waiting for committed samples ({snap.num_samples} so far, {snap.complete}/{snap.num_tasks} "
                    f"tasks complete; train.follow_start_fraction={self.tc.follow_start_fraction})"
                )
                said = True
            time.sleep(float(self.tc.follow_poll_s))

    def _wait_for_file(self, f: Path) -> None:
        deadline = time.time() + max(600.0, float(self.tc.follow_timeout_s) * 2)
        while not f.is_file():
            if time.time() > deadline:
                print(f"[eagle-batch train] rank {self.rank}: {f} never appeared (rank 0 gone?)", file=sys.stderr)
                raise TimeoutError(f"{f} was not written by rank 0")
            time.sleep(0.2)

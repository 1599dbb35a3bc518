"""The commit protocol of regenerated output: whole shards, never half a file, never a conversation twice.

A task writes the conversations of one batch as one shard, in this order:

1. `output/.task-TTTTT-NNNNN.jsonl.partial`: the rows, fsynced (`.partial` is no input prepare reads);
2. `shards/task-TTTTT/NNNNN.json`: the shard's record ({ids of every conversation of the batch, the
   rows written, the failures by reason, counts}), written to a temporary name, fsynced and renamed:
   **the commit point**;
3. `output/task-TTTTT-NNNNN.jsonl`: the rows renamed into place, and the folder fsynced.

Opening the writer (under the task's lock, one writer per task) recovers: a record whose rows are still
`.partial` (a kill between 2 and 3) gets its rename finished; a `.partial` without a record (a kill before 2)
is deleted, and its conversations are generated again. So the committed conversations are exactly those in
the records, each in exactly one shard, and output/ only ever holds whole shards.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from eagle_batch.store.durable import fsync_dir, write_json_atomic
from eagle_batch.store.lock import StoreLock

OUTPUT = "output"
SHARDS = "shards"


def _shard_name(task_id: int, n: int) -> str:
    return f"task-{task_id:05d}-{n:05d}"


class ShardWriter:
    """The single writer of one task's output shards; `committed` holds the ids already done."""

    def __init__(self, run_dir: str | os.PathLike, task_id: int, fsync: bool = True):
        self.run_dir, self.task_id, self.fsync = Path(run_dir), int(task_id), fsync
        self.out = self.run_dir / OUTPUT
        self.records = self.run_dir / SHARDS / f"task-{task_id:05d}"
        self.out.mkdir(parents=True, exist_ok=True)
        self.records.mkdir(parents=True, exist_ok=True)
        self._lock = StoreLock(self.records)  # a duplicate task for the same shard folder is refused
        try:
            self.committed: set[str] = set()
            self.next_shard = 0
            self.totals: dict[str, int] = {}
            self._recover()
        except BaseException:
            self._lock.release()
            raise

    def _partial(self, n: int) -> Path:
        return self.out / f".{_shard_name(self.task_id, n)}.jsonl.partial"

    def _final(self, n: int) -> Path:
        return self.out / f"{_shard_name(self.task_id, n)}.jsonl"

    def _recover(self) -> None:
        done = sorted(int(p.stem) for p in self.records.glob("[0-9]*.json"))
        for n in done:
            rec = json.loads((self.records / f"{n:05d}.json").read_text())
            if not self._final(n).exists():
                if not self._partial(n).exists():
                    raise RuntimeError(
                        f"{self.records / f'{n:05d}.json'} records a shard whose rows are gone "
                        f"({self._final(n)}); restore the file or delete the record to regenerate it"
                    )
                os.rename(self._partial(n), self._final(n))
            self.committed.update(rec["ids"])
            for k, v in rec["counts"].items():
                self.totals[k] = self.totals.get(k, 0) + int(v)
        self.next_shard = (done[-1] + 1) if done else 0
        prefix, recorded = f".task-{self.task_id:05d}-", set(done)
        for p in self.out.glob(f"{prefix}*.jsonl.partial"):  # written, never committed: generated again
            if int(p.name[len(prefix) : len(prefix) + 5]) not in recorded:
                p.unlink()
        if self.fsync:
            fsync_dir(self.out)

    def commit(self, ids: Iterable[str], rows: list[dict], failures: list[dict], counts: dict[str, int]) -> None:
        """Commit one batch: `ids` every conversation it settles (written or failed), `rows` the output."""
        ids = [str(i) for i in ids]
        again = [i for i in ids if i in self.committed]
        if again:
            raise ValueError(f"conversations {again[:3]} are committed already (task {self.task_id})")
        n = self.next_shard
        part = self._partial(n)
        with open(part, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        write_json_atomic(
            self.records / f"{n:05d}.json",
            {"shard": self._final(n).name, "ids": ids, "failures": failures, "counts": counts},
            self.fsync,
        )
        if self.fsync:
            fsync_dir(self.records)
        os.rename(part, self._final(n))
        if self.fsync:
            fsync_dir(self.out)
        self.committed.update(ids)
        for k, v in counts.items():
            self.totals[k] = self.totals.get(k, 0) + int(v)
        self.next_shard = n + 1

    def close(self) -> None:
        self._lock.release()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_records(run_dir: str | os.PathLike) -> list[dict]:
    """Every committed shard record of a regeneration run."""
    return [json.loads(p.read_text()) for p in sorted((Path(run_dir) / SHARDS).glob("task-*/[0-9]*.json"))]

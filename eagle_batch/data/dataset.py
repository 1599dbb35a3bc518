"""`PreparedDataset(run_dir)`: the prepared samples of a run, read one array task at a time.

samples.parquet is written in plan order with row groups that never straddle two tasks, so a task
reads only its own row groups (a few MB for a task of a large run) instead of the whole file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PREPARED = "prepared"
SAMPLES = "samples.parquet"
PLAN = "plan.json"
SUMMARY = "summary.json"
BAD_ROWS = "bad_rows.jsonl"


@dataclass(frozen=True)
class Sample:
    sample_id: str
    input_ids: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # uint8 [T]


def _list_column(chunked, dtype) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for chunk in chunked.chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        # Copies: callers may keep or mutate samples; views would pin the whole row group.
        out.extend(values[offsets[i] : offsets[i + 1]].copy() for i in range(len(chunk)))
    return out


class PreparedDataset:
    """Read-only view of RUN/prepared: `.num_tasks`, `.task_samples(task_id)`, `len()`, `.summary`."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / PREPARED
        plan_path = self.dir / PLAN
        if not plan_path.is_file() or not (self.dir / SAMPLES).is_file():
            raise FileNotFoundError(
                f"{self.dir} has no prepared dataset ({PLAN}, {SAMPLES}); run "
                f"`eagle-batch prepare CONFIG run_dir={self.run_dir}` first."
            )
        self.plan = json.loads(plan_path.read_text())
        self.num_tasks = int(self.plan["num_tasks"])
        self._row_group_starts: np.ndarray | None = None

    def __len__(self) -> int:
        return sum(len(t["rows"]) for t in self.plan["tasks"])

    @property
    def summary(self) -> dict:
        return json.loads((self.dir / SUMMARY).read_text())

    def max_sample_tokens(self) -> int:
        """Tokens of the longest prepared sample (0 for none)."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        col = pq.read_table(self.dir / SAMPLES, columns=["num_tokens"]).column("num_tokens")
        return int(pc.max(col).as_py() or 0) if len(col) else 0

    def sample_lengths(self) -> tuple[list[str], np.ndarray]:
        """(sample ids, token counts) of every prepared sample, in plan order (two columns, no token ids)."""
        import pyarrow.parquet as pq

        t = pq.read_table(self.dir / SAMPLES, columns=["sample_id", "num_tokens"])
        return t.column("sample_id").to_pylist(), t.column("num_tokens").to_numpy().astype(np.int64)

    def task_rows(self, task_id: int) -> list[int]:
        if not 0 <= task_id < self.num_tasks:
            raise IndexError(
                f"task_id {task_id} out of range: the plan has {self.num_tasks} tasks (0..{self.num_tasks - 1})"
            )
        return list(self.plan["tasks"][task_id]["rows"])

    def task_num_tokens(self, task_id: int) -> int:
        self.task_rows(task_id)
        return int(self.plan["tasks"][task_id]["num_tokens"])

    def task_samples(self, task_id: int) -> list[Sample]:
        """The task's samples in plan order, reading only the row groups that hold them."""
        import pyarrow.parquet as pq

        rows = self.task_rows(task_id)
        if not rows:
            return []
        pf = pq.ParquetFile(self.dir / SAMPLES)
        if self._row_group_starts is None:
            md = pf.metadata
            self._row_group_starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
        starts = self._row_group_starts
        lo, hi = min(rows), max(rows)
        first = int(np.searchsorted(starts, lo, side="right") - 1)
        last = int(np.searchsorted(starts, hi, side="right") - 1)
        groups = list(range(first, last + 1))
        table = pf.read_row_groups(groups, columns=["sample_id", "input_ids", "loss_mask"])
        base = int(starts[first])
        ids = _list_column(table.column("input_ids"), np.int32)
        masks = _list_column(table.column("loss_mask"), np.uint8)
        sids = table.column("sample_id").to_pylist()
        return [Sample(sids[r - base], ids[r - base], masks[r - base]) for r in rows]

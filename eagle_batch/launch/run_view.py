"""What `status` reads of a run folder, read with as few metadata calls as a parallel file system allows.

On Lustre/GPFS every open, stat or directory read that misses the client cache is a round trip to the one
metadata server every user shares. A per-task `exists()` / `is_dir()` / `read_text()` is several of them per
task; at 10,000 tasks that is tens of thousands per `status`. Here instead:

- `RunListing.read(run)`: one directory read (`os.scandir`) of RUN/state and one of RUN/stores give which
  task has a state file, a repair request, a store: no stat per file (a directory entry carries its name
  and type);
- `read_states(run, listing)`: one open per state file that exists, nothing for the tasks that have none;
- `Rerooter`: log paths recorded inside the run folder are checked once per directory, not once per task
  (and not at all when they lie under the run folder as it is named now).

The per-task state file stays the truth (the task writes it atomically); nothing here caches across calls.
`launch/follow.py` re-reads only what changed between polls (the journal, `launch/state_journal.py`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import state as S

_TASK_FILE = re.compile(r"(task|repair)-(\d+)\.json$")
_STORE_DIR = re.compile(r"task-(\d+)\.zarr$")


@dataclass
class RunListing:
    """Which task has a state file, a repair request and a store: two directory reads in all."""

    states: set[int] = field(default_factory=set)
    repairs: set[int] = field(default_factory=set)
    stores: set[int] | None = None  # None: RUN/stores does not exist (not an extraction run, or none started)

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> "RunListing":
        run = Path(run_dir)
        out = cls()
        try:
            with os.scandir(run / S.STATE_DIR) as it:
                for e in it:
                    m = _TASK_FILE.match(e.name)
                    if m:
                        (out.states if m.group(1) == "task" else out.repairs).add(int(m.group(2)))
        except FileNotFoundError:
            pass
        out.stores = list_stores(run)
        return out


def list_stores(run_dir: str | os.PathLike) -> set[int] | None:
    """Task ids with a store folder under RUN/stores (one directory read); None when RUN/stores is absent."""
    try:
        with os.scandir(Path(run_dir) / "stores") as it:
            # DirEntry.is_dir() answers from the entry's type: no stat (except on the rare file systems that
            # report no type, where Python stats it).
            return {int(m.group(1)) for e in it if (m := _STORE_DIR.match(e.name)) and e.is_dir()}
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_one(run_dir: str | os.PathLike, task_id: int) -> S.TaskState | None:
    """The task's state file (None when it has none): one open."""
    return S.read_state(run_dir, task_id)


def read_states(run_dir: str | os.PathLike, listing: RunListing, task_ids) -> dict[int, S.TaskState]:
    """The state files of `task_ids` that the listing saw: one open each. A file that went away since the
    listing (a task does not delete its own) is skipped; one that does not parse raises StateFileError as
    `state.read_state` does. Paths are joined as strings: a Path per task costs more than the read here."""
    out = {}
    folder = os.path.join(os.fspath(run_dir), S.STATE_DIR)
    for t in task_ids:
        if t not in listing.states:
            continue
        path = os.path.join(folder, f"task-{t:05d}.json")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        try:
            out[t] = S.TaskState.from_json(json.loads(data))
        except (ValueError, TypeError):
            out[t] = S.read_state(run_dir, t)  # raises the StateFileError that names the file and the fix
    return out


class Rerooter:
    """`in_this_run` for many paths: a path recorded inside the run folder, re-rooted at `run_dir` when the
    folder was moved since (records keep absolute paths).

    A path under the run folder as it is named now is returned as it is, without a look. Any other path is
    resolved by its directory, once per directory: the directory as it is if it exists, else the longest tail
    of it (two parts at least) that exists under run_dir."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.prefix = os.path.abspath(run_dir) + os.sep
        self._dirs: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        if not path or os.path.abspath(path).startswith(self.prefix):
            return path
        head, tail = os.path.split(path)
        if head not in self._dirs:
            self._dirs[head] = self._reroot_dir(head)
        return os.path.join(self._dirs[head], tail) if self._dirs[head] != head else path

    def _reroot_dir(self, head: str) -> str:
        if os.path.isdir(head):
            return head
        parts = Path(head).parts
        for i in range(1, len(parts) - 1):
            candidate = self.run_dir.joinpath(*parts[i:])
            if candidate.is_dir():
                return str(candidate)
        return head


def read_plan_totals(run_dir: str | os.PathLike) -> dict[int, tuple[int, int]]:
    """{task_id: (samples, tokens)} from prepared/plan.json: totals before a task has started."""
    try:
        plan = json.loads((Path(run_dir) / "prepared" / "plan.json").read_text())
        return {
            int(t["task_id"]): (int(t.get("num_samples", len(t.get("rows", [])))), int(t.get("num_tokens", 0)))
            for t in plan["tasks"]
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


@dataclass
class RunView:
    """Everything per task that `status` derives its rows from, read in one go (or kept up to date by a
    follower): the listing, the state files, the plan's totals, the submissions."""

    listing: RunListing
    states: dict[int, S.TaskState]
    plan: dict[int, tuple[int, int]]
    submissions: list[S.Submission]

    @classmethod
    def read(cls, run_dir: str | os.PathLike, num_tasks: int) -> "RunView":
        listing = RunListing.read(run_dir)
        return cls(
            listing=listing,
            states=read_states(run_dir, listing, range(num_tasks)),
            plan=read_plan_totals(run_dir),
            submissions=S.read_submissions(run_dir),
        )

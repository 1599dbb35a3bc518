"""RUN/state/journal.jsonl: one line per task state write, so a `--wait` follower re-reads only what changed.

A task writes its state file (RUN/state/task-XXXXX.json, atomically) and then appends one line here with the
same state less its throughput history, in one `write` on a descriptor opened with O_APPEND (lines of
concurrent tasks do not interleave on a local or parallel file system). A follower remembers how far it read;
a poll is one stat of this file when nothing changed, and one open plus the new bytes when something did:
no per-task call, whatever the number of tasks.

The state files stay the truth; the journal is only news of them. Whatever the journal cannot vouch for
makes the reader fall back to reading every state file: a line that does not parse (a task killed in the
middle of its append, a hand edit), a journal that was rotated or replaced (another inode, or shorter than
the offset read), or an append that never came (a task killed between its state write and its append: its
job's state changes in Slurm, which makes the follower re-read that task; follow.py also re-reads every
state file at a bounded rate). A failed append is not the task's failure: it is skipped.

When the journal passes ROTATE_BYTES, the task that notices renames it to journal.jsonl.1 (replacing an
older one); a follower sees the new inode and reads every state file once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

JOURNAL_NAME = "journal.jsonl"
ROTATE_BYTES = 64 << 20  # ~300,000 lines at ~200 bytes: a 1,000-task run committing every minute, ~5 hours


def journal_path(state_dir: str | os.PathLike) -> Path:
    return Path(state_dir) / JOURNAL_NAME


def journal_entry(state: dict[str, Any]) -> dict[str, Any]:
    """The state as the journal keeps it: everything `status` shows, less the throughput history (which only
    the report's plot reads, from the state file)."""
    extra = {k: v for k, v in (state.get("extra") or {}).items() if k != "history"}
    return {**state, "extra": extra}


def append(state_dir: str | os.PathLike, state: dict[str, Any]) -> bool:
    """Append one state (a TaskState.to_json()) after its state file was replaced. False (and nothing
    raised) when the append failed: the state file is written, a follower's full read catches up."""
    path = journal_path(state_dir)
    line = (json.dumps(journal_entry(state), separators=(",", ":")) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > ROTATE_BYTES:
            os.replace(path, path.with_name(JOURNAL_NAME + ".1"))
    except OSError:
        return False
    return True


class JournalTail:
    """A reader's place in the journal: `mark()` where it is now, `news()` the states appended since."""

    def __init__(self, state_dir: str | os.PathLike):
        self.path = journal_path(state_dir)
        self.inode: int | None = None
        self.offset = 0

    def mark(self) -> None:
        """Remember the journal's end as it is now (call it before a full read of the state files: anything
        appended after it is read again by the next `news()`)."""
        try:
            st = os.stat(self.path)
            self.inode, self.offset = st.st_ino, st.st_size
        except FileNotFoundError:
            self.inode, self.offset = None, 0

    def news(self) -> dict[int, dict[str, Any]] | None:
        """{task_id: its latest state} appended since the last look; {} when nothing was (one stat); None when
        the journal cannot vouch for what changed (rotated, replaced, a line that does not parse): read every
        state file, then `mark()` again."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            # No journal: no task wrote a state since (or an eagle-batch that writes none runs them).
            return {} if self.inode is None else None
        if self.inode is None and self.offset == 0:
            self.inode = st.st_ino  # created since the mark: read it from its start
        if st.st_ino != self.inode or st.st_size < self.offset:
            return None
        if st.st_size == self.offset:
            return {}
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(st.st_size - self.offset)
        end = data.rfind(b"\n") + 1  # only whole lines; a line still being appended is read next time
        self.offset += end
        out: dict[int, dict[str, Any]] = {}
        for line in data[:end].splitlines():
            try:
                d = json.loads(line)
                out[int(d["task_id"])] = d
            except (ValueError, KeyError, TypeError):
                return None
        return out

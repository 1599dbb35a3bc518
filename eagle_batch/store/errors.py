"""The store's exceptions, at the bottom of the package so that every module can raise them.

`StoreError` and its subclasses reach users (they are `UserError`s): each message names the store (and the
shard or field) and what to do. `ShardError` is internal: a shard file that does not decode; callers turn it
into a `StoreCorruptError` or a verify `Problem` that says which store and what to run.
"""

from __future__ import annotations

import errno
from pathlib import Path

from eagle_batch.errors import UserError


def extract_then_aggregate(run: Path) -> str:
    """What to run on a run directory that has nothing extracted yet (the advice of every reader of RUN)."""
    return (
        "run `eagle-batch extract CONFIG` (the config it was prepared with; `eagle-batch status "
        f"{run}` shows where the run stands), then `eagle-batch aggregate {run}`"
    )


class StoreError(UserError, RuntimeError):
    """Base class of store errors; messages name the store (and shard/field) and what to do."""


class StoreLockedError(StoreError):
    """Another process holds the store's writer lock."""

    exit_code = 1  # nothing wrong with the input: the work cannot run now


class StoreMismatchError(StoreError):
    """An existing store was written with a different spec or layout than the one asked for."""


class StoreCorruptError(StoreError):
    """Committed data is missing or damaged."""

    exit_code = 1  # a failed check, not a usage mistake


class DamagedDataError(StoreCorruptError):
    """Committed rows a reader refused (a chunk whose crc32c differs from the committed record, a shard that
    is missing, truncated or does not decode). `str()` is the one message for the user: the store, the array,
    the shard and chunk, the samples it holds and the repair. `sample_ids` are the samples that cannot be read;
    `reason` says what is wrong in a few words (a skipped sample's warning)."""

    def __init__(
        self, message: str, store: str = "", array: str = "", shard: int = -1, chunk: int = -1, sample_ids=(), reason=""
    ):
        super().__init__(message)
        self.store, self.array, self.shard, self.chunk = store, array, shard, chunk
        self.sample_ids = list(sample_ids)
        self.reason = reason or message

        self.sample_id = ""  # the sample whose read met the damage (for_sample)

    def for_sample(self, sample_id: str) -> "DamagedDataError":
        """This error as met by a read of sample `sample_id`."""
        err = DamagedDataError(str(self), self.store, self.array, self.shard, self.chunk, self.sample_ids, self.reason)
        err.sample_id = sample_id
        return err

    def __reduce__(self):  # crosses from a DataLoader worker to the trainer whole
        args = (str(self), self.store, self.array, self.shard, self.chunk, self.sample_ids, self.reason)
        return _rebuild_damaged, (args, self.sample_id)


def _rebuild_damaged(args: tuple, sample_id: str) -> DamagedDataError:
    return DamagedDataError(*args).for_sample(sample_id)


class StoreFullError(StoreError):
    """A write found its filesystem full (or the quota exhausted); `folder` is the folder it wrote in."""

    def __init__(self, message: str, folder: str = ""):
        super().__init__(message)
        self.folder = folder

    def __reduce__(self):
        return type(self), (str(self), self.folder)


class ShardError(ValueError):
    """A shard file that cannot be decoded. `str()` names the file; `detail` says what is wrong without it."""

    def __init__(self, where: str, detail: str):
        super().__init__(f"{where}: {detail}" if where else detail)
        self.where = where
        self.detail = detail

    def __reduce__(self):
        return type(self), (self.where, self.detail)


def no_space_error(path: Path, e: OSError) -> StoreFullError:
    """A full disk or quota as a StoreError that names the store and what to do (a bare ENOSPC names neither)."""
    store = next((p for p in (path, *path.parents) if p.suffix == ".zarr"), path.parent)
    what = "quota exceeded" if e.errno == errno.EDQUOT else "no space left on device"
    return StoreFullError(
        f"{store}: {what} while writing {path.relative_to(store) if store in path.parents else path}. "
        "Everything committed before is intact (this write was not committed). Free space on that "
        f"file system (`df -h {store.parent}`) or raise the quota, then resume the task "
        "(`eagle-batch resume RUN`): it continues from its last commit.",
        folder=str(store.parent),
    )

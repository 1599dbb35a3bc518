"""Durable file operations: every store file is replaced atomically and, with fsync on, survives power loss.

A file is written to `<name>.<uuid>.partial`, fsynced, renamed over `<name>`, and its directory fsynced
(or the directory is remembered and fsynced once before the next record: `sync_dir=False`, `defer`). A
reader therefore sees either the old file or the whole new one; a kill leaves at most a `*.partial`, which
the next writer deletes. A full disk or quota becomes a StoreError naming the store and what to do.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from .errors import no_space_error
from .format import PARTIAL_SUFFIX


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under `root`, then every directory (the entries of the files just synced)."""
    for f in root.rglob("*"):
        if f.is_file():
            fsync_file(f)
        fsync_dir(f.parent if f.is_file() else f)


def publish(tmp: Path, path: Path, fsync: bool = True) -> None:
    """Rename the finished file `tmp` to `path`; with fsync, its bytes and its new directory entry are
    durable on return (the bytes before the rename, so a crash never leaves `path` naming a torn file)."""
    if fsync:
        fsync_file(tmp)
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def partial_name(path: Path) -> Path:
    # Same suffix as zarr's LocalStore temporaries, so one cleanup rule removes both.
    return path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")


_IOV_MAX = 1024


def _write_all(fd: int, views: list[memoryview]) -> None:
    """All of `views`, in order, with as few system calls as the kernel allows (writev): each call drops the
    GIL once, not once per piece, which matters with many busy threads in one process."""
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i : i + _IOV_MAX])
        while n:
            if n >= len(views[i]):
                n -= len(views[i])
                i += 1
            else:
                views[i] = views[i][n:]
                n = 0


def write_atomic(path: Path, pieces: Sequence[bytes | memoryview], fsync: bool = True, sync_dir: bool = True) -> None:
    """Write `pieces` to `path` via a `.partial` file and rename; with fsync, durable on return.

    sync_dir=False leaves the rename's directory entry to the caller's fsync_dir (batched per commit)."""
    tmp = partial_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        _write_all(fd, [mv for mv in (memoryview(p).cast("B") for p in pieces) if len(mv)])
        if fsync:
            os.fsync(fd)
    except BaseException as e:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space_error(path, e) from e
        raise
    os.close(fd)
    os.replace(tmp, path)
    if fsync and sync_dir:
        fsync_dir(path.parent)


def write_json_atomic(path: Path, obj, fsync: bool = True) -> None:
    write_atomic(path, [json.dumps(obj, separators=(",", ":")).encode()], fsync=fsync)


def makedirs_durable(path: Path, fsync: bool = True, defer: set | None = None) -> None:
    """mkdir -p that fsyncs the parent of every directory it creates (so the new entries survive);
    with `defer`, adds those parents to the set instead, for one fsync each at the next commit."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            pass
        if defer is not None:
            defer.add(d.parent)
        elif fsync:
            fsync_dir(d.parent)

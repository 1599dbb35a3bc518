"""Write a model folder once, atomically, readable as the user's umask says.

Several processes (array tasks, test workers) may build the same cached model at once: each writes a
private temporary folder, marks it complete and renames it into place; the loser of the race keeps the
winner's folder. A folder without `.complete` is never returned.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

COMPLETE = ".complete"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def honour_umask(folder: Path) -> None:
    """chmod a freshly written folder to what the user's umask gives a new file/dir: mkdtemp makes 0700 and
    safetensors writes model.safetensors 0600, which would hide a shared model cache from the group."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for p in folder.rglob("*"):
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def is_complete(dest: Path) -> bool:
    return (Path(dest) / COMPLETE).is_file()


def write_model_folder(dest: str | os.PathLike, write: Callable[[Path], None], note: str) -> Path:
    """Run `write(tmp)` into a temporary sibling of `dest`, mark it complete, rename it to `dest`."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        write(tmp)
        (tmp / COMPLETE).write_text(note.rstrip("\n") + "\n")
        honour_umask(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:  # another process finished first
            if not is_complete(dest):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest

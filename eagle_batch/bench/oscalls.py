"""Count the file-system metadata calls Python code makes: `with MetadataCalls() as calls: ...; calls.total`.

On a parallel file system (Lustre, GPFS) every call that names a path (open, stat, readdir) is a round trip
to the one metadata server all users share, unless the client cache answers it; reads and writes of an
open descriptor go to the data servers instead. The counter wraps the os / io functions that name a path
(os.path.exists, Path.is_dir and friends go through os.stat; Path.read_text through io.open;
Path.iterdir through os.listdir), so the count is exact and deterministic for what Python does. Calls made
from C (pyarrow, zarr's own IO) are not seen: `strace -f -c` cross-checks the whole process where strace
exists (bench/scale.py).

Reads and writes are counted apart: `rename`, `unlink`, `mkdir` and `fsync` change the namespace or force
a sync (the task side of a run), the rest only look. The wrappers are installed for the duration of the
`with` block only, in this process.
"""

from __future__ import annotations

import builtins
import io
import os
from collections import Counter
from typing import Any

# name -> (module, attribute): what is wrapped. os.path.* and pathlib reach these through the os module.
LOOKS = {
    "stat": (os, "stat"),
    "lstat": (os, "lstat"),
    "open": (os, "open"),
    "builtins.open": (builtins, "open"),
    "io.open": (io, "open"),
    "scandir": (os, "scandir"),
    "listdir": (os, "listdir"),
    "access": (os, "access"),
    "statvfs": (os, "statvfs"),
}
CHANGES = {
    "replace": (os, "replace"),
    "rename": (os, "rename"),
    "unlink": (os, "unlink"),
    "remove": (os, "remove"),
    "mkdir": (os, "mkdir"),
    "rmdir": (os, "rmdir"),
    "fsync": (os, "fsync"),
}


class MetadataCalls:
    """A counter of path-naming os calls while the `with` block runs (single-threaded or not: a Counter
    update under the GIL)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._saved: list[tuple[Any, str, Any]] = []

    def _wrap(self, name: str, module: Any, attr: str) -> None:
        original = getattr(module, attr)
        counts = self.counts

        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return original(*args, **kwargs)

        self._saved.append((module, attr, original))
        setattr(module, attr, counted)

    def __enter__(self) -> "MetadataCalls":
        # builtins.open and io.open are the same function: wrap both names (code binds either), count once.
        for name, (module, attr) in {**LOOKS, **CHANGES}.items():
            self._wrap(name, module, attr)
        return self

    def __exit__(self, *exc: Any) -> None:
        for module, attr, original in reversed(self._saved):
            setattr(module, attr, original)
        self._saved.clear()

    @property
    def looks(self) -> int:
        """Calls that read the namespace: open, stat, lstat, access, scandir, listdir, statvfs."""
        return sum(v for k, v in self.counts.items() if k in LOOKS)

    @property
    def changes(self) -> int:
        """Calls that change it or force a sync: rename/replace, unlink, mkdir, rmdir, fsync."""
        return sum(v for k, v in self.counts.items() if k in CHANGES)

    @property
    def total(self) -> int:
        return self.looks + self.changes

    def as_dict(self) -> dict:
        return {
            "total": self.total,
            "looks": self.looks,
            "changes": self.changes,
            "by_call": dict(sorted(self.counts.items())),
        }

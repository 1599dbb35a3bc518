"""Memory that the store's encode processes can read and write: named regions and the writer's arena.

A chunk is handed to an encode process as (file, offset, size), never as bytes through a pipe, so the only
data the processes touch is memory both sides map:
- `SharedRegions`: where a caller's memory comes from. The capture registers its shared ring (the file the
  vLLM worker's device-to-host copies land in); lent rows inside a registered region are compressed in
  place by another process.
- `SharedArena`: the writer's own chunk and output buffers, in anonymous memory files (memfd: nothing to
  clean up after a kill -9) that other processes open through /proc/<pid>/fd/<fd>.
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

_ALIGN = 4096
ARENA_SEGMENT_BYTES = 256 << 20


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


class SharedRegions:
    """Address ranges of this process that are mappings of a file other processes can open."""

    def __init__(self) -> None:
        self._regions: list[tuple[int, int, str, int]] = []  # (start, end, path, file offset of start)
        # The arrays themselves: while registered their mapping cannot go away, so no other mapping can take
        # its addresses and be mistaken for it.
        self._keep: list[np.ndarray] = []
        self._lock = threading.Lock()

    def add(self, path: str, array: np.ndarray, file_offset: int = 0) -> None:
        """`array` maps `path` from byte `file_offset` on."""
        start = _address(array)
        region = (start, start + array.nbytes, str(path), int(file_offset))
        with self._lock:
            if region not in self._regions:
                self._regions = [*self._regions, region]  # a new list: locate() reads without the lock
                self._keep.append(array)

    def __bool__(self) -> bool:
        return bool(self._regions)

    def locate(self, a: np.ndarray) -> tuple[str, int] | None:
        """(path, file offset) of a C-contiguous array lying inside a region, else None."""
        if not a.flags.c_contiguous:
            return None
        p = _address(a)
        for start, end, path, off in self._regions:  # a handful of regions: a scan is the fast way
            if start <= p and p + a.nbytes <= end:
                return path, off + p - start
        return None


class SharedArena:
    """Buffers carved from memfd segments, registered in `regions`. Never freed one by one: callers keep
    free lists (the writer's streams do), and everything goes when the arena is closed and unreferenced."""

    def __init__(self, regions: SharedRegions, segment_bytes: int = ARENA_SEGMENT_BYTES):
        self.regions = regions
        self.segment_bytes = segment_bytes
        self._segments: list[tuple[int, mmap.mmap]] = []
        self._cur: np.ndarray | None = None
        self._used = 0
        self._lock = threading.Lock()

    @staticmethod
    def supported() -> bool:
        return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")

    def _new_segment(self, nbytes: int) -> None:
        size = max(self.segment_bytes, -(-nbytes // _ALIGN) * _ALIGN)
        fd = os.memfd_create("eagle-batch-store", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._segments.append((fd, mm))
        self._cur = np.frombuffer(mm, np.uint8)
        self._used = 0
        self.regions.add(f"/proc/{os.getpid()}/fd/{fd}", self._cur)

    def new(self, nbytes: int) -> np.ndarray:
        """A fresh uint8 buffer of `nbytes` that other processes can map."""
        with self._lock:
            if self._cur is None or self._used + nbytes > len(self._cur):
                self._new_segment(nbytes)
            buf = self._cur[self._used:self._used + nbytes]
            self._used += -(-nbytes // _ALIGN) * _ALIGN
            return buf

    @property
    def nbytes(self) -> int:
        return sum(len(mm) for _, mm in self._segments)

    def close(self) -> None:
        """Closes the files; the memory goes once the last buffer view is gone."""
        for fd, _ in self._segments:
            try:
                os.close(fd)
            except OSError:
                pass
        self._segments = []
        self._cur = None

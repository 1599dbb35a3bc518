"""One encode process (started by `encode_procs.EncodeProcessPool`): reads (job id, source file, offset, size,
destination file, offset, capacity) from its socket, encodes the source rows into the destination and answers
(job id, (size, crc32c of the rows, crc32c of the encoded bytes), error). Exits when the socket closes."""

from __future__ import annotations

import mmap
import os
import sys
from multiprocessing.connection import Connection

import numpy as np


def _serve(conn: Connection, codec_name: str, level: int, blocksize: int, itemsize: int) -> None:
    import crc32c

    from .encoder import ChunkEncoder
    from .format import Codec

    encoder = ChunkEncoder(Codec(codec_name, level, blocksize), itemsize)
    conn.send(("ready", encoder.direct, encoder.why_not_direct))
    maps: dict[str, np.ndarray] = {}

    def view(path: str) -> np.ndarray:
        m = maps.get(path)
        if m is None:
            fd = os.open(path, os.O_RDWR)
            try:
                m = maps[path] = np.frombuffer(mmap.mmap(fd, 0), np.uint8)
            finally:
                os.close(fd)
        return m

    dtype = np.dtype(f"u{itemsize}")
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        job_id, spath, soff, nbytes, dpath, doff, cap = job
        try:
            chunk = view(spath)[soff:soff + nbytes].view(dtype)
            out = view(dpath)[doff:doff + cap]
            data = encoder.encode(chunk, out)
            size = len(data) if not isinstance(data, memoryview) else data.nbytes
            if not isinstance(data, memoryview):  # the numcodecs fallback returned new bytes
                out[:size] = np.frombuffer(data, np.uint8)
            conn.send((job_id, (size, crc32c.crc32c(chunk), crc32c.crc32c(out[:size])), None))
        except Exception as e:  # noqa: BLE001 - reported to the writer, which fails the task with it
            conn.send((job_id, None, f"{type(e).__name__}: {e}"))


def main(argv: list[str]) -> None:
    fd, codec_name, level, blocksize, itemsize, nice = argv
    try:
        os.nice(int(nice))  # compression yields to the engine's threads when both want a core
    except OSError:
        pass
    _serve(Connection(int(fd)), codec_name, int(level), int(blocksize), int(itemsize))


if __name__ == "__main__":
    main(sys.argv[1:])

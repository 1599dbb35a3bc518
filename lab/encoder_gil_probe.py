"""How much of a chunk's compression holds the GIL: a Python thread spins while the main thread encodes
64 MiB buffers; its progress relative to spinning alone for the same time is printed per operation
(1.0: the operation never holds the GIL; 0.5: it holds it about half the time).

    PYTHONPATH=. python lab/encoder_gil_probe.py
"""

import threading
import time

import crc32c
import numpy as np

from eagle_batch.store.encoder import ChunkEncoder
from eagle_batch.store.format import Codec


def spin(stop: threading.Event, counts: list) -> None:
    n = 0
    while not stop.is_set():
        n += 1
    counts.append(n)


def spinner_progress(fn, reps: int) -> tuple[float, float]:
    stop, busy = threading.Event(), []
    t = threading.Thread(target=spin, args=(stop, busy))
    t.start()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    dt = time.perf_counter() - t0
    stop.set()
    t.join()
    stop, alone = threading.Event(), []
    t = threading.Thread(target=spin, args=(stop, alone))
    t.start()
    time.sleep(dt)
    stop.set()
    t.join()
    return dt, busy[0] / alone[0]


def main() -> None:
    # bf16 bit patterns of normal floats: compressible exponent bytes, noisy mantissa bytes, like states
    a = (np.random.default_rng(0).standard_normal((64 << 20) // 2, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b = np.empty_like(a)
    codec = Codec("blosc-zstd", 1)
    enc = ChunkEncoder(codec, 2)
    frames = ChunkEncoder(codec, 2, entropy_only=True)
    out = np.empty(enc.bound(a.nbytes), np.uint8)
    nc = codec.numcodec()
    for name, fn, reps in [
        ("np.copyto", lambda: np.copyto(b, a), 20),
        ("crc32c", lambda: crc32c.crc32c(a), 20),
        (f"store encoder (direct={enc.direct})", lambda: enc.encode(a, out), 3),
        (f"entropy-only frames ({frames.entropy_only})", lambda: frames.encode(a, out), 3),
        ("numcodecs Blosc.encode", lambda: nc.encode(a), 3),
    ]:
        dt, p = spinner_progress(fn, reps)
        print(f"{name:34s} {dt:5.2f} s   spinner progress {p:.2f} of alone")


if __name__ == "__main__":
    main()

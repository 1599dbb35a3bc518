"""The three timed phases of `eagle-batch bench capture` (eagle_batch/bench/capture.py runs each in a fresh
subprocess): `plain` (prefill only), `eagle-batch` (run_capture into a real task store; with --sweep several
runs on one warm engine) and `stock` (vLLM's ExampleHiddenStatesConnector, CUDA only)."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import time
from pathlib import Path

from eagle_batch import environment


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def phase_plain(args, cfg, samples, warm) -> dict:
    from eagle_batch.capture.backend import VllmBackend

    b = VllmBackend(cfg, cfg.model.layer_ids)
    b._start()
    try:
        sp = [b._sampling_params(s.sample_id) for s in warm]
        b.llm.generate(b._prompts(warm), sp, use_tqdm=False)
        t0 = time.perf_counter()  # prompt building inside the clock, as in run_capture
        prompts, sp = b._prompts(samples), [b._sampling_params(s.sample_id) for s in samples]
        outs = b.llm.generate(prompts, sp, use_tqdm=False)
        dt = time.perf_counter() - t0
    finally:
        b.close()
    assert len(outs) == len(samples)
    return dict(seconds=dt)


class _Drop:
    """A sink that only waits for each captured sample's copy and hands its memory back: the capture path's own
    cost, without a store."""

    def __init__(self):
        self.samples = 0

    def put(self, it):
        if it.ready is not None:
            it.ready()
        if it.release is not None:  # a shared-ring slot: the ring only advances past released records
            it.release()
        self.samples += 1


SWEEP_KEYS = ("codec", "threads", "io_threads", "adaptive", "entropy", "switch_ms")


def parse_sweep(spec: str) -> list[tuple[str, dict[str, str]]]:
    """'drop;default;none:codec=none' -> [("drop", {}), ("default", {}), ("none", {"codec": "none"})]."""
    out = []
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        name, _, kvs = part.partition(":")
        opts = dict(kv.split("=", 1) for kv in kvs.split(",") if kv)
        bad = [k for k in opts if k not in SWEEP_KEYS]
        if bad or not name:
            raise SystemExit(
                f"--sweep {part!r}: unknown keys {bad} (choose from {SWEEP_KEYS})"
                if bad
                else f"--sweep {part!r}: every run needs a name"
            )
        out.append((name, opts))
    return out


def _eagle_run(cfg, samples, backend, work: Path, opts: dict[str, str], keep: bool) -> dict:
    """One timed eagle-batch capture of `samples` into a fresh store on a started backend."""
    import copy

    from eagle_batch.capture.engine import run_capture
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    cfg = copy.deepcopy(cfg)
    if "codec" in opts:
        cfg.store.codec = opts["codec"]
    if "adaptive" in opts:
        cfg.store.adaptive = opts["adaptive"].lower() in ("1", "true", "yes")
    if "entropy" in opts:
        cfg.store.entropy_only = opts["entropy"].lower() in ("1", "true", "yes")
    if "threads" in opts:
        cfg.store.encode_threads = int(opts["threads"])
    if "io_threads" in opts:
        cfg.store.io_threads = int(opts["io_threads"])
    saved_switch = sys.getswitchinterval()
    store = work / "eagle-batch-store.zarr"
    shutil.rmtree(store, ignore_errors=True)
    try:
        if "switch_ms" in opts:
            sys.setswitchinterval(float(opts["switch_ms"]) / 1000)
        spec = StoreSpec(
            layer_ids=backend.layer_ids,
            hidden_size=backend.hidden_size,
            model_name=Path(cfg.model.path).name,
            dtype=cfg.store.dtype,
        )
        writer = TaskStoreWriter.open(store, spec, cfg.store)
        try:
            t0 = time.perf_counter()
            stats = run_capture(cfg, samples, writer, backend=backend)  # returns after the final commit
            dt = time.perf_counter() - t0
            chunk_stats = writer.chunk_stats()
            entropy_only = writer.encoder_info()["entropy_only"]
        finally:
            writer.close()
    finally:
        sys.setswitchinterval(saved_switch)
    out = dict(
        seconds=dt,
        samples=stats.samples,
        commits=stats.commits,
        store_bytes=_du(store),
        raw_bytes=stats.tokens * len(backend.layer_ids) * backend.hidden_size * 2,
        codec=str(cfg.store.codec),
        store_dtype=str(cfg.store.dtype),
        fsync=bool(cfg.store.fsync),
        adaptive=bool(cfg.store.adaptive),
        entropy_only=entropy_only,
        chunks=chunk_stats,
        chunk_tokens=writer.layouts["hidden_states"].chunk_tokens,
        encode_threads=writer.encode_threads,
        io_threads=writer.io_threads,
        writer_busy_s=round(stats.writer_busy_s, 3),
        backpressure_s=round(stats.backpressure_s, 3),
        store_stall_s={k: round(v, 3) for k, v in writer.stall_s.items()},
    )
    out["compression_ratio"] = round(out["raw_bytes"] / max(out["store_bytes"], 1), 3)
    if not keep:
        shutil.rmtree(store, ignore_errors=True)
    return out


def phase_eagle(args, cfg, samples, warm, work: Path) -> dict:
    from eagle_batch.capture import make_backend

    runs = parse_sweep(args.sweep) if args.sweep else [("default", {})]
    backend = make_backend(cfg)
    results = []
    try:
        backend.run_batch(warm, _Drop())
        for name, opts in runs:
            if name == "drop":
                sink = _Drop()
                t0 = time.perf_counter()
                backend.run_batch(samples, sink)
                r = dict(seconds=time.perf_counter() - t0, samples=sink.samples)
            else:
                r = _eagle_run(cfg, samples, backend, work, opts, args.keep)
            r.update(name=name, options=opts, tok_s=sum(len(x.input_ids) for x in samples) / r["seconds"])
            print(f"  sweep {name} {opts}: {r['tok_s']:,.0f} tok/s", file=sys.stderr, flush=True)
            results.append(r)
    finally:
        backend.close()
    main = next((r for r in results if r["name"] == "default"), results[-1])
    out = {k: v for k, v in main.items() if k not in ("name", "options", "tok_s")}
    if len(results) > 1:
        out["sweep"] = results
    return out


def phase_stock(args, cfg, samples, warm, work: Path) -> dict:
    import torch

    if not torch.cuda.is_available():
        return dict(skipped="vLLM's ExampleHiddenStatesConnector creates torch.cuda streams/events: CUDA only")
    from eagle_batch.capture import vllm_compat as compat
    from eagle_batch.capture.backend import VllmBackend

    files = work / "stock-files"
    shutil.rmtree(files, ignore_errors=True)
    files.mkdir(parents=True)
    b = VllmBackend(cfg, cfg.model.layer_ids)
    # Its files are written, and their locks released, on engine steps after the request finished: the
    # background engine process keeps stepping; an in-process engine would not, and waiting for a file's
    # lock (load_hidden_states) would never end.
    environment.set_vllm_multiprocessing(True)
    b._start(
        speculative_config=compat.speculative_config(b.layer_ids),
        kv_transfer_config={
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(files)},
        },
    )

    def wait_written(outs):
        paths = []
        for o in outs:
            p = (o.kv_transfer_params or {}).get("hidden_states_path")
            if p is None:
                raise RuntimeError(f"stock connector returned no hidden_states_path for request {o.request_id}")
            lock = p + ".lock"
            if os.path.exists(lock):
                with open(lock) as lf:
                    fcntl.flock(lf, fcntl.LOCK_SH)  # released by the writer thread when the file is complete
            paths.append(p)
        return paths

    try:
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        wait_written(b.llm.generate(b._prompts(warm), sp, use_tqdm=False))
        prompts = b._prompts(samples)
        t0 = time.perf_counter()
        paths = wait_written(b.llm.generate(prompts, sp, use_tqdm=False))
        dt = time.perf_counter() - t0
    finally:
        b.close()
    out = dict(seconds=dt, files=len(paths), bytes=_du(files))
    if not args.keep:
        shutil.rmtree(files, ignore_errors=True)
    return out

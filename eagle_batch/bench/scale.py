"""`eagle-batch bench scale --tasks N [N ...] [--json]` (or `python -m eagle_batch.bench.scale`): what each
user-facing verb costs on a run of N tasks, counted in metadata calls and timed on this disk.

For each N it builds a run through the real writers (bench/scale_run.py: N task stores of synthetic states,
tiny chunks; 1% of the tasks failed or never run), then runs each verb in its own process
(bench/scale_verb.py): `status`, `status --json`, `resume --dry-run`, one `--wait` poll when nothing changed
and one after 1% of the tasks wrote their state, `cancel` (no live job, so it sends nothing: what it reads),
`aggregate`, the training loader's open + first batch, and `verify` (optional, it reads every byte).

Per verb: metadata calls (bench/oscalls.py: open, stat, scandir, ... as Python makes them), calls per task,
a modelled time on a parallel file system (calls x --latency-ms, a metadata round trip that misses the
client cache), the local wall time and the process's peak memory. With --strace (and strace installed) the
`status` process is also counted by `strace -f -c` (every file syscall, start-up included) as a cross-check.

Also reported: the task side (metadata calls per store open, commit and finalize of one task, per minute of
a running task at extract.commit_interval_s, and for a 1,000-task array), the `--wait` follower's average
load (launch/follow.py's interval and full-read rules), and the files and inodes per TB a capture leaves
at the default chunking (store/format.py's layouts) for hidden sizes 2048 and 7168.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle_batch.cli.common import float_at_least, int_at_least

VERBS = (
    "status",
    "status --json",
    "resume --dry-run",
    "poll idle",
    "poll changed",
    "cancel",
    "aggregate",
    "loader",
    "verify",
    "verify --jobs 4",
)
# Verbs held to about one metadata call per task (docs/explanation/scale.md); verify reads every file.
BUDGETED = VERBS[:-2]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", type=int_at_least(2), nargs="+", default=[100, 1000], help="run sizes (default 100 1000)")
    p.add_argument(
        "--dir",
        default="",
        help="where the runs are built and kept (a run built there before is measured again, not rebuilt); "
        "default: a temporary folder, removed after",
    )
    p.add_argument("--keep", action="store_true", help="keep the runs built")
    p.add_argument("--latency-ms", type=float_at_least(0.0), default=0.5, help="a metadata round trip (default 0.5)")
    p.add_argument(
        "--verify-max-tasks",
        type=int_at_least(0),
        default=1000,
        help="run verify (it reads every byte of every store) only on runs of at most this many tasks",
    )
    p.add_argument(
        "--written-stores",
        type=int_at_least(1),
        default=100,
        help="stores written through the writer per run; the others are copies (bench/scale_run.py)",
    )
    p.add_argument("--strace", action="store_true", help="also count `status` with strace -f -c (if installed)")


def touch_states(run: str | os.PathLike, fraction: float, seed: int = 1) -> list[int]:
    """Have `fraction` of the tasks with a state file write it again, as a running task does after a commit
    (state.write_state: atomic replace, then the journal line). Returns the task ids."""
    from eagle_batch.launch import state as S
    from eagle_batch.launch.run_view import RunListing

    have = sorted(RunListing.read(run).states)
    picked = sorted(random.Random(seed).sample(have, max(1, round(len(have) * fraction))))
    for t in picked:
        st = S.read_state(run, t)
        st.tok_s += 1.0
        S.write_state(run, st)
    return picked


def _verb(verb: str, run: Path) -> dict:
    cmd = [sys.executable, "-m", "eagle_batch.bench.scale_verb", verb, str(run)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"verb": verb, "error": (r.stderr or r.stdout).strip()[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _strace_status(run: Path) -> dict | None:
    """`strace -f -c` of a whole `eagle-batch status RUN` process (start-up included): the file syscalls."""
    if shutil.which("strace") is None:
        return None
    out = run.parent / f"strace-{run.name}.txt"
    cmd = ["strace", "-f", "-c", "-o", str(out), "-e", "trace=%file,getdents64,%desc"]
    cmd += [sys.executable, "-m", "eagle_batch", "status", str(run)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not out.is_file():
        return {"error": r.stderr.strip()[-500:]}
    counts = {}
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] not in ("total",):
            counts[parts[-1]] = int(parts[3])
    out.unlink()
    names = ("openat", "open", "stat", "newfstatat", "lstat", "statx", "access", "getdents64", "readlink")
    return {"by_syscall": counts, "metadata": sum(v for k, v in counts.items() if k in names)}


def follower_load(n: int, full_calls: int, idle_calls: int, changed_calls: int) -> dict:
    """A `--wait` follower's average metadata calls per second with the default interval (launch/follow.py)."""
    from eagle_batch.launch.follow import default_interval_s, full_read_every_s

    interval, every = default_interval_s(n), full_read_every_s(n)
    return {
        "interval_s": interval,
        "full_read_every_s": every,
        "calls_per_s_idle": round(full_calls / every + idle_calls / interval, 2),
        "calls_per_s_busy": round(full_calls / every + changed_calls / interval, 2),
    }


def task_side(writes: dict, commit_interval_s: float, tasks: int = 1000) -> dict:
    """The task side's metadata load from one task's counted writes (bench/scale_run.py)."""
    commits = writes["commit"]
    per_commit = sum(c["total"] for c in commits) / max(1, len(commits))
    per_minute = per_commit * 60.0 / commit_interval_s
    return {
        "per_open": writes["open"]["total"],
        "per_commit": round(per_commit, 1),
        "per_finalize": writes["finalize"]["total"],
        "commit_interval_s": commit_interval_s,
        "per_task_minute": round(per_minute, 1),
        f"array_of_{tasks}_calls_per_s": round(per_minute * tasks / 60.0, 1),
        "by_phase": writes,
    }


def inode_budget(hidden_size: int, num_layers: int = 4, dtype: str = "bfloat16") -> dict:
    """Files and inodes per TB of a capture at the default chunking (StoreConfig) from the real layouts:
    each shard k of an array is the file `ARRAY/c/k/0...` (a directory per row dimension, then the file)."""
    from eagle_batch.config import StoreConfig
    from eagle_batch.store.footprint import least_bytes_per_token, raw_bytes_per_token
    from eagle_batch.store.format import Codec, auto_chunk_tokens, hidden_row_nbytes, make_layouts
    from eagle_batch.store.spec import StoreSpec

    cfg = StoreConfig()
    spec = StoreSpec(layer_ids=list(range(1, num_layers + 1)), hidden_size=hidden_size, dtype=dtype)
    chunk = cfg.chunk_tokens or auto_chunk_tokens(hidden_row_nbytes(spec), cfg.shard_tokens)
    layouts = make_layouts(spec, chunk, cfg.shard_tokens, Codec(cfg.codec, cfg.level, cfg.blocksize))
    inodes_per_shard = sum(len(lay.shard_key(0).split("/")) - 1 for lay in layouts.values())
    files_per_shard = len(layouts)
    stored = least_bytes_per_token(num_layers, hidden_size, dtype, cfg.codec)  # the fewest: the most tokens/TB
    shards_per_tb = 1e12 / stored / cfg.shard_tokens
    return {
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "dtype": dtype,
        "shard_tokens": cfg.shard_tokens,
        "chunk_tokens": chunk,
        "raw_bytes_per_token": raw_bytes_per_token(num_layers, hidden_size, dtype),
        "stored_bytes_per_token": round(stored, 1),
        "hidden_shard_mb_raw": round(cfg.shard_tokens * hidden_row_nbytes(spec) / 1e6, 1),
        "files_per_tb": round(shards_per_tb * files_per_shard),
        "inodes_per_tb": round(shards_per_tb * inodes_per_shard),
    }


def store_fixed_inodes(store: Path) -> int:
    """Inodes of a finalized store that are not shard files or shard directories (metadata, record, marker,
    lock, index arrays): counted on a store the benchmark built."""
    total = sum(1 for _ in store.rglob("*"))
    shard_like = sum(1 for p in store.rglob("*") if "c" in p.relative_to(store).parts[1:2])
    return total - shard_like + 1  # + the store's own directory


def _one_size(n: int, base: Path, args: argparse.Namespace) -> dict:
    from eagle_batch.config import load_run_config
    from eagle_batch.progress import progress

    from .scale_run import RunShape, build_run

    run = base / f"run-{n}"
    record = base / f"run-{n}.build.json"
    if record.is_file() and run.is_dir():  # built by an earlier call with this --dir: measure it again
        built = json.loads(record.read_text())
    else:
        t0 = time.perf_counter()
        shape = RunShape(written_stores=args.written_stores)
        bar = lambda xs: progress(xs, desc=f"build {n}", unit="task", enabled=not args.json)  # noqa: E731
        built = build_run(run, n, shape, progress=bar)
        built["build_s"] = time.perf_counter() - t0
        record.write_text(json.dumps(built))
    build_s = built["build_s"]
    verbs = {}
    for verb in VERBS:
        if verb.startswith("verify") and n > args.verify_max_tasks:
            continue
        r = _verb(verb, run)
        if "calls" in r:
            r["calls_per_task"] = round(r["calls"]["total"] / n, 3)
            r["modelled_pfs_s"] = round(r["calls"]["total"] * args.latency_ms / 1000.0, 3)
        verbs[verb] = r
        if not args.json:
            print(f"N={n} {verb}: {json.dumps({k: v for k, v in r.items() if k != 'calls'})}", file=sys.stderr)
    out = {
        "tasks": n,
        "failed": len(built["failed"]),
        "missing": len(built["missing"]),
        "build_s": round(build_s, 1),
        "written_stores": built["written_stores"],
        "verbs": verbs,
        "task_side": task_side(built["task_writes"], load_run_config(run).extract.commit_interval_s),
        "store_fixed_inodes": store_fixed_inodes(next((run / "stores").glob("*.zarr"))),
    }
    status_full = verbs["status"].get("calls", {}).get("total", 0)
    out["follower"] = follower_load(
        n,
        status_full,
        verbs["poll idle"].get("calls", {}).get("total", 0),
        verbs["poll changed"].get("calls", {}).get("total", 0),
    )
    if args.strace:
        out["strace_status"] = _strace_status(run)
    return out


def run(args: argparse.Namespace) -> int:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="eb-bench-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "bench": "scale",
        "latency_ms": args.latency_ms,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "node": platform.node()},
        "budgeted_verbs": list(BUDGETED),
        "inodes": [inode_budget(2048), inode_budget(7168)],
        "sizes": [],
    }
    try:
        for n in args.tasks:
            result["sizes"].append(_one_size(n, base, args))
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eagle_batch.bench.scale", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print only the JSON result object")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

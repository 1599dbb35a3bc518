"""`python -m eagle_batch.bench.scale_verb VERB RUN`: run one user-facing verb on RUN in this process and print
one JSON line: its metadata calls (bench.oscalls), wall time and peak memory. bench/scale.py starts one
process per verb so that each peak memory (ru_maxrss) is the verb's own.

The verb's modules are imported before counting starts: the counts are what the verb does on the run, not
what Python's import system looks up (identical for every N).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import sys
import time
from collections.abc import Callable

from .oscalls import MetadataCalls

LAZY_IMPORTS = ("eagle_batch.store", "eagle_batch.launch", "eagle_batch.launch.status", "eagle_batch.launch.follow")


def _verb(*argv: str) -> Callable[[], object]:
    """The command as `eagle-batch ARGV` parses it, run in this process (its imports done before counting)."""
    import importlib

    from eagle_batch.cli import _parse, build_parser

    parser, loaded = build_parser([argv[0]])
    args = _parse(parser, loaded[argv[0]], list(argv))
    module = importlib.import_module(args._module)
    # What the verbs import inside run(): the store (zarr and numcodecs, whose import reads the entry points
    # of every installed distribution: ~560 opens, the same for every N) and the launch package.
    for name in LAZY_IMPORTS:
        importlib.import_module(name)
    return lambda: module.run(args)


def _status(run: str, as_json: bool) -> Callable[[], object]:
    return _verb("status", run, *(["--json"] if as_json else []))


def _resume_dry(run: str) -> Callable[[], object]:
    return _verb("resume", run, "--dry-run")


def _cancel(run: str) -> Callable[[], object]:
    return _verb("cancel", run)


def _aggregate(run: str) -> Callable[[], object]:
    return _verb("aggregate", run, "--no-progress", "--json")


def _verify(run: str, jobs: int) -> Callable[[], object]:
    return _verb("verify", run, "--no-progress", "--json", "--jobs", str(jobs or 1))


def _loader(run: str) -> Callable[[], object]:
    """What `train` does before its first step: open the aggregated run, the lengths for the batch plan,
    and the first batch (workers off: the count is the reads, not the worker start-up)."""
    from eagle_batch.store import open_dataset
    from eagle_batch.train.data import BatchPlan, TrainSamples, collate

    def first_batch() -> object:
        ds = open_dataset(run)
        ids = ds.layer_ids
        samples = TrainSamples(ds, ids[:-1], ids[-1])
        plan = BatchPlan(samples.lengths(), batch_tokens=256, seed=0)
        return collate([samples[i] for i in plan.epoch_batches(0)[0]])

    return first_batch


def _poll(run: str, phase: str) -> Callable[[], object]:
    """One `--wait` poll of a follower that has already looked once (`phase`: idle = nothing changed since,
    changed = 1% of the tasks wrote their state since); the follower's first look is not counted."""
    from eagle_batch.launch.follow import Follower

    from .scale import touch_states

    follower = Follower(run)
    follower.poll()
    if phase == "changed":
        touch_states(run, fraction=0.01)
    return follower.poll


def verb_function(verb: str, run: str, jobs: int = 0) -> Callable[[], object]:
    table: dict[str, Callable[[], Callable[[], object]]] = {
        "status": lambda: _status(run, False),
        "status --json": lambda: _status(run, True),
        "resume --dry-run": lambda: _resume_dry(run),
        "cancel": lambda: _cancel(run),
        "aggregate": lambda: _aggregate(run),
        "verify": lambda: _verify(run, jobs),
        "verify --jobs 4": lambda: _verify(run, 4),
        "loader": lambda: _loader(run),
        "poll idle": lambda: _poll(run, "idle"),
        "poll changed": lambda: _poll(run, "changed"),
    }
    return table[verb]()


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM; ru_maxrss would carry the parent's peak across exec)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def measure(verb: str, run: str, jobs: int = 0) -> dict:
    fn = verb_function(verb, run, jobs)
    sink = io.StringIO()
    rss0 = peak_rss_mb()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), MetadataCalls() as calls:
        t0 = time.perf_counter()
        rc = fn()
        wall = time.perf_counter() - t0
    return {
        "verb": verb,
        "rc": rc if isinstance(rc, int) else 0,
        "wall_s": round(wall, 4),
        "calls": calls.as_dict(),
        "peak_rss_mb": peak_rss_mb(),
        "rss_before_mb": rss0,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m eagle_batch.bench.scale_verb")
    p.add_argument("verb")
    p.add_argument("run_dir")
    p.add_argument("--jobs", type=int, default=0)
    a = p.parse_args(argv)
    print(json.dumps(measure(a.verb, a.run_dir, a.jobs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Metadata calls of each user-facing verb on a run of 1,000 tasks, counted, never timed.

On a parallel file system each metadata call (open, stat, directory read) is a round trip to a server every
user shares, so the verbs of a big run must make about one per task, not several (docs/explanation/scale.md
has the budget table and how it was measured). The run is built once for the module through the real
writers (bench/scale_run.py) and each verb runs in this process under bench/oscalls.py's counter.

Two checks per verb: the budget (calls per task, below), and for `status` and `aggregate` the documented
figure: the count measured at N = 1,000 in benchmarks/scale-local-disk.json, which this test reads; a count
above 5x that figure fails. Calls, not wall time: the count is deterministic, a time on a shared CI machine
is not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle_batch.bench.scale_run import RunShape, build_run
from eagle_batch.bench.scale_verb import measure

N = 1000
# Calls per task each verb may make at N = 1,000 (about one per task plus a fixed start: the plan, config,
# submissions, Slurm's client tools looked up on PATH). The poll, cancel and the loader's open make none per task.
BUDGET = {
    "status": 1.1,
    "status --json": 1.1,
    "resume --dry-run": 1.2,
    "poll idle": 0.06,
    "poll changed": 0.06,
    "cancel": 0.06,
    "aggregate": 1.1,
    "loader": 0.1,
}
DOCUMENTED = Path(__file__).resolve().parents[2] / "benchmarks" / "scale-local-disk.json"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scale") / "run"
    build_run(path, N, RunShape(written_stores=4))
    return path


@pytest.fixture(scope="module")
def counts(run) -> dict[str, dict]:
    # In this order: the polls rewrite 1% of the states, aggregate writes the index the loader opens.
    return {verb: measure(verb, str(run)) for verb in BUDGET}


@pytest.mark.parametrize("verb", list(BUDGET))
def test_metadata_calls_per_task_within_budget(counts, verb):
    r = counts[verb]
    assert r["rc"] == 0, r
    per_task = r["calls"]["total"] / N
    assert per_task <= BUDGET[verb], f"{verb}: {r['calls']} = {per_task:.3f} calls per task > {BUDGET[verb]}"


def _documented(verb: str) -> int:
    doc = json.loads(DOCUMENTED.read_text())
    size = next(s for s in doc["sizes"] if s["tasks"] == N)
    return int(size["verbs"][verb]["calls"]["total"])


@pytest.mark.parametrize("verb", ["status", "aggregate"])
def test_within_five_times_the_documented_figure(counts, verb):
    documented = _documented(verb)
    assert counts[verb]["calls"]["total"] <= 5 * documented, (counts[verb]["calls"], documented)


def test_train_after_finds_the_unfinished_arrays_with_one_read_per_task(run):
    """`train --after RUN` (launch.submit.pending_arrays): the arrays of the tasks not done yet."""
    from eagle_batch.bench.oscalls import MetadataCalls
    from eagle_batch.bench.scale_run import FAKE_ARRAY_JOB
    from eagle_batch.launch.submit import pending_arrays

    with MetadataCalls() as calls:
        arrays = pending_arrays(run)
    assert set(arrays) == {FAKE_ARRAY_JOB}  # the failed and never-run tasks of the one submission
    assert calls.total / N <= 1.1, calls.as_dict()

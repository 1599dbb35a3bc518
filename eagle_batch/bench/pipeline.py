"""`eagle-batch bench pipeline`: time from `extract` to an exported draft, pipelined (`train --follow`) against
training after the extraction (afterok), on the demo's model and chats, through the CLI a user types.

Both runs prepare the same chats, extract with the same settings and train the same number of steps with the
same held-out samples (train.holdout_fraction): they differ only in when training starts. Per run it reports
the wall time from the `extract` command to the exported draft, the extraction's and the training's own times,
the held-out loss and teacher-forced acceptance length, and (pipelined) the samples the trainer saw at each
epoch as extraction went on.

    eagle-batch bench pipeline --json [--executor local] [--limit 300] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work", default="runs/bench-pipeline", help="folder for the two runs (replaced)")
    p.add_argument("--executor", choices=("local", "slurm"), default="local", help="where the extraction runs")
    p.add_argument("--limit", type=int, default=0, help="use only the first N chats (0 = all 300)")
    p.add_argument("--holdout", type=float, default=0.1, help="train.holdout_fraction of both runs")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for both runs")


def _cli(*args: str, log: Path) -> subprocess.CompletedProcess:
    with open(log, "a") as f:
        f.write(f"$ eagle-batch {' '.join(args)}\n")
        f.flush()
        r = subprocess.run([sys.executable, "-m", "eagle_batch.cli", *args], stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise SystemExit(f"bench pipeline: `eagle-batch {' '.join(args)}` exited {r.returncode}; see {log}")
    return r


def _one(mode: str, work: Path, overrides: list[str]) -> dict:
    from eagle_batch.models.smollm2 import materialize

    from ..demo import DATA_FILE

    run_dir = work / mode
    log = work / f"{mode}.log"
    conf = [
        str(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"),
        f"run_dir={run_dir}",
        f"model.path={materialize()}",
        f"data.inputs=[{DATA_FILE}]",
        *overrides,
    ]
    _cli("prepare", *conf, "--no-progress", log=log)
    t0 = time.time()
    if mode == "pipelined":
        _cli("extract", *conf, log=log)  # returns once the tasks are submitted
        _cli("train", *conf, "--local", "--follow", "--no-progress", log=log)
        t_train_end = time.time()
        _wait_done(run_dir, log)
    else:
        _cli("extract", *conf, "--wait", "--no-progress", log=log)
        _cli("aggregate", str(run_dir), log=log)
        _cli("train", *conf, "--local", "--no-progress", log=log)
        t_train_end = time.time()
    # The extraction's end: the last task store's completion marker (written when its task finishes).
    from eagle_batch.store.format import COMPLETE_NAME

    t_extract_end = max(p.stat().st_mtime for p in (run_dir / "stores").glob(f"*/{COMPLETE_NAME}"))
    out = run_dir / "train" / "demo-draft"
    result = json.loads((out / "result.json").read_text())
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    start = next(e for e in events if e.get("event") == "start")
    snaps = [
        {k: e[k] for k in ("epoch", "samples", "tasks_complete", "time") if k in e}
        for e in events
        if e.get("event") == "snapshot"
    ]
    return {
        "mode": mode,
        "extract_to_draft_s": round(t_train_end - t0, 1),
        "extract_s": round(t_extract_end - t0, 1),
        "train_start_after_extract_s": round(start["time"] - t0, 1) if "time" in start else None,
        "steps": result["step"],
        "heldout": result.get("heldout"),
        "snapshots": snaps,
        "log": str(log),
    }


def _wait_done(run_dir: Path, log: Path) -> None:
    """The pipelined run's extraction to its end: every task store complete."""
    from eagle_batch.config import load_run_config
    from eagle_batch.store.format import COMPLETE_NAME

    n = load_run_config(run_dir).extract.num_tasks
    deadline = time.time() + 3600
    while time.time() < deadline:
        if len(list((run_dir / "stores").glob(f"*/{COMPLETE_NAME}"))) >= n:
            return
        time.sleep(2)
    raise SystemExit(f"bench pipeline: the extraction of {run_dir} did not finish in an hour; see {log}")


def run(args: argparse.Namespace) -> int:
    import shutil

    work = Path(args.work).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    overrides = [f"slurm.executor={args.executor}", f"train.holdout_fraction={args.holdout}", *args.overrides]
    if args.limit:
        overrides.append(f"data.limit={args.limit}")
    rows = [_one(mode, work, overrides) for mode in ("afterok", "pipelined")]
    after, piped = rows
    res = {
        "bench": "pipeline",
        "runs": rows,
        "extract_to_draft_ratio": round(piped["extract_to_draft_s"] / after["extract_to_draft_s"], 3),
    }
    if after["heldout"] and piped["heldout"]:
        res["heldout_loss_rel_diff"] = round(piped["heldout"]["loss"] / after["heldout"]["loss"] - 1, 4)
    print(json.dumps(res, indent=None if args.json else 2))
    return 0

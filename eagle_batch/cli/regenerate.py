"""`eagle-batch regenerate CONFIG [CONFIG ...] [key=value ...] [--wait] [--then-prepare]`: the target answers.

Plans RUN/regenerate (the conversations of data.inputs, balanced over regenerate.num_tasks) and submits one
array task per plan task, on Slurm or the local executor, exactly as `extract` does: `eagle-batch status
RUN/regenerate`, `resume` and `cancel` work on it. Running it again submits only what is not done. The
output, RUN/regenerate/output/, is a JSON Lines folder in the messages format. `--then-prepare` runs
`prepare` on it (data.inputs=[RUN/regenerate/output], data.format=messages) and submits the extraction:
on Slurm as a job that starts after the array succeeds (afterok); on the local executor once the array is
done (it waits).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

from eagle_batch.cli.common import add_config_arguments, add_interval_argument, config_from_args
from eagle_batch.config import ConfigError, RunConfig
from eagle_batch.config.load import REGENERATE_SECTIONS
from eagle_batch.regenerate.plan import PLAN, PREPARED, regenerate_dir

# The sections that decide what a regeneration run writes: a plan made under other values is not reused.
IDENTITY = REGENERATE_SECTIONS


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--wait", action="store_true", help="follow the array to the end, then print the summary")
    add_interval_argument(p)
    p.add_argument(
        "--then-prepare",
        action="store_true",
        help="then prepare RUN from the output and submit the extraction (Slurm: afterok; local: after --wait)",
    )
    p.add_argument("--force", action="store_true", help="plan again although RUN/regenerate has another plan")


def regeneration_config(cfg: RunConfig) -> RunConfig:
    """The config the regeneration tasks run with: the user's, with its own run directory and work."""
    rcfg = copy.deepcopy(cfg)
    rdir = str(regenerate_dir(cfg).resolve())
    rcfg.run_dir = rcfg.regenerate.run_dir = rdir
    rcfg.extract.work = "regenerate"
    rcfg.extract.num_tasks = cfg.regenerate.num_tasks
    return rcfg


def extraction_config(cfg: RunConfig) -> RunConfig:
    """The user's config reading the regenerated output, rendered as it was generated."""
    from eagle_batch.regenerate.plan import template_kwargs

    xcfg = copy.deepcopy(cfg)
    xcfg.data.inputs = [str(regenerate_dir(cfg).resolve() / "output")]
    xcfg.data.format = "messages"
    xcfg.data.chat_template_kwargs = template_kwargs(cfg)
    return xcfg


def prepare_and_extract(cfg: RunConfig) -> dict:
    """prepare RUN from the regenerated output, then submit its extraction array (a job of its own on Slurm)."""
    from eagle_batch.cli.extract import check_before_submit
    from eagle_batch.data import prepare
    from eagle_batch.launch.submit import submit_tasks

    xcfg = extraction_config(cfg)
    summary = prepare(xcfg, progress=False)
    check_before_submit(xcfg)
    sub = submit_tasks(xcfg, xcfg.run_dir, list(range(summary["tasks"]["num_tasks"])), kind="extract")
    return {"prepared_samples": summary["samples"], "extraction": sub.job_id}


def _claim(cfg: RunConfig, rcfg: RunConfig, force: bool) -> None:
    """Plan the run unless RUN/regenerate already holds this run's plan (then it is resumed)."""
    from eagle_batch.config import load_run_config
    from eagle_batch.config.validate import plan_differences, planned_config
    from eagle_batch.regenerate.plan import plan_regeneration

    run_dir = Path(rcfg.run_dir)
    _check_not_another_run(cfg, rcfg)
    if (run_dir / PREPARED / PLAN).is_file():
        theirs = planned_config(run_dir) or load_run_config(run_dir)  # a plan made before planned.yaml existed
        differ = plan_differences(theirs, rcfg, IDENTITY)
        if not differ:
            return
        if not force:
            raise ConfigError(
                f"{run_dir} holds a regeneration planned with other settings ({differ}); use a new "
                "regenerate.run_dir, or pass --force to plan again (refused once output exists)."
            )
    from eagle_batch.data.tally import reasons_text

    s = plan_regeneration(rcfg)
    skipped = f" ({reasons_text(s['skipped_by_reason'])})" if s["skipped_by_reason"] else ""
    for w in s["file_warnings"]:
        print(f"eagle-batch regenerate: warning: {w}", file=sys.stderr)
    print(
        f"planned {run_dir}: {s['conversations']} conversations ({s['turns_to_write']} turns to write) from "
        f"{s['rows_read']} rows, {s['rows_skipped']} skipped{skipped}, {s['tasks']} task(s)"
    )


def _check_not_another_run(cfg: RunConfig, rcfg: RunConfig) -> None:
    """regenerate.run_dir must not be an extraction run (planning would replace its prepared/ and config.yaml)."""
    from eagle_batch.config import load_run_config

    run_dir = Path(rcfg.run_dir)
    if run_dir == Path(cfg.run_dir).resolve():
        raise ConfigError(
            f"regenerate.run_dir={cfg.regenerate.run_dir} is run_dir itself, where prepare and extract write; "
            "leave regenerate.run_dir empty (RUN/regenerate) or choose a folder of its own."
        )
    if not (run_dir / "config.yaml").is_file():
        return
    try:
        work = load_run_config(run_dir).extract.work
    except ConfigError:
        return  # unreadable: the plan check below names it
    if work != "regenerate":
        raise ConfigError(
            f"regenerate.run_dir={run_dir} is another kind of run (its config.yaml has extract.work={work}: an "
            "extraction run), not a regeneration; regenerating there would replace its prepared data. Leave "
            "regenerate.run_dir empty (RUN/regenerate) or choose a folder of its own."
        )


def run(args: argparse.Namespace) -> int:
    from eagle_batch.config import check_config, save_config
    from eagle_batch.launch.local import local_summary
    from eagle_batch.launch.state import DONE, read_state
    from eagle_batch.launch.submit import check_slurm_request, live_tasks, resolve_executor, submit_after, submit_tasks

    cfg = config_from_args(args)
    check_config(cfg)
    rcfg = regeneration_config(cfg)
    which = resolve_executor(rcfg)  # once: with `auto` it asks the Slurm controller
    check_slurm_request(rcfg, which)  # before the plan: reading every input row can take a while
    run_dir = Path(rcfg.run_dir)
    _claim(cfg, rcfg, args.force)
    save_config(rcfg, run_dir)
    n = rcfg.extract.num_tasks
    live = live_tasks(run_dir)
    todo = [t for t in range(n) if t not in live and ((st := read_state(run_dir, t)) is None or st.status != DONE)]
    if todo:
        sub = submit_tasks(rcfg, run_dir, todo, kind="extract", executor=which)
        where = local_summary(sub) if which == "local" else f"Slurm array {sub.job_id}"
        print(f"submitted {len(todo)} regeneration task(s) of {n}: {where}")
    else:
        print(f"all {n} regeneration tasks of {run_dir} are done or running; nothing to submit.")
    print(f"follow with: eagle-batch status {run_dir}")
    if args.then_prepare and which == "slurm":
        chained_cfg = copy.deepcopy(rcfg)
        chained_cfg.slurm.gpus_per_node = 0  # prepare needs no GPU; the extraction it submits asks its own
        chained = submit_after(run_dir, prepare_and_extract, cfg, name="prepare", aggregate=False, cfg=chained_cfg)
        after = chained.dependency or "nothing: the regeneration is done"
        print(
            f"submitted job {chained.job_id}: prepare {cfg.run_dir} from the output, then its extraction (after {after})"
        )
    if not (args.wait or (args.then_prepare and which != "slurm")):
        return 0
    return _follow_and_finish(args, cfg, run_dir, chain=args.then_prepare and which != "slurm")


def _follow_and_finish(args: argparse.Namespace, cfg: RunConfig, run_dir: Path, chain: bool) -> int:
    from eagle_batch.launch.follow import follow
    from eagle_batch.regenerate.summary import nothing_written, regeneration_summary, summary_lines

    final = follow(run_dir, args.interval, live=not args.no_progress)
    summary = regeneration_summary(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(summary_lines(summary)))
    if not final["totals"]["all_done"]:
        return 1
    empty = nothing_written(summary)
    if empty:
        print(f"eagle-batch regenerate: {empty}", file=sys.stderr)
        return 1
    if chain:
        r = prepare_and_extract(cfg)
        print(
            f"prepared {cfg.run_dir} ({r['prepared_samples']} samples); extraction {r['extraction']} submitted: "
            f"`eagle-batch status {cfg.run_dir}`"
        )
    return 0

"""`eagle-batch extract CONFIG [CONFIG ...] [key=value ...] [--wait] [--then-train]`: submit the run's array."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eagle_batch.cli.common import add_config_arguments, add_interval_argument, config_from_args, config_sources


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--wait", action="store_true", help="follow the array to the end with a live progress line")
    add_interval_argument(p)
    p.add_argument(
        "--then-train",
        action="store_true",
        help="also submit `eagle-batch train CONFIG` with an afterok dependency on the array",
    )
    p.add_argument("--force", action="store_true", help="reuse a run_dir whose config.yaml has a different data config")


def check_before_submit(cfg) -> int:
    """Everything checkable before anything is queued; returns the plan's number of tasks. The capture work
    needs the model, and the prepared samples must fit it; another work (a work of your own) gets the
    config's value checks."""
    from eagle_batch.config import ConfigError, check_config, check_prepared_fits, check_values
    from eagle_batch.data import PreparedDataset
    from eagle_batch.launch.state import plan_num_tasks
    from eagle_batch.launch.work import UnknownWorkError, resolve_work

    try:
        resolve_work(cfg.extract.work)  # an unknown name fails here, not in every task
    except UnknownWorkError as e:
        raise ConfigError(str(e)) from None
    if cfg.extract.work != "capture":
        check_values(cfg)
        return plan_num_tasks(cfg.run_dir)
    check_config(cfg)
    n = plan_num_tasks(cfg.run_dir)
    prepared = PreparedDataset(cfg.run_dir)
    check_prepared_fits(cfg, prepared.max_sample_tokens(), str(prepared.dir))
    return n


def run(args: argparse.Namespace) -> int:
    from eagle_batch.config import claim_run_dir, save_config
    from eagle_batch.launch.disk_room import capture_room
    from eagle_batch.launch.local import local_summary
    from eagle_batch.launch.run_view import RunView
    from eagle_batch.launch.state import DONE, arrays_of, read_submissions
    from eagle_batch.launch.status import writes_stores
    from eagle_batch.launch.submit import SubmitError, check_slurm_request, live_tasks, resolve_executor, submit_tasks

    cfg = config_from_args(args)
    run_dir = cfg.run_dir
    n = check_before_submit(cfg)
    which = resolve_executor(cfg)  # once: with `auto` it asks the Slurm controller
    check_slurm_request(cfg, which)
    train_cfgs = _training_configs(args, cfg) if args.then_train else []
    live = live_tasks(run_dir)
    if live:
        raise SubmitError(
            f"{run_dir} already has {len(live)} task(s) queued or running (jobs "
            f"{', '.join(sorted(set(live.values()))[:5])}). Nothing was submitted. Follow them "
            f"with `eagle-batch status {run_dir}`, or `eagle-batch cancel {run_dir}` first."
        )
    view = RunView.read(run_dir, n)  # two directory reads and one open per state file
    states = {t: view.states.get(t) for t in range(n)}
    stores = view.listing.stores is not None or writes_stores(Path(run_dir))  # without RUN/stores: RUN/config.yaml
    have = view.listing.stores or set()
    lost = [t for t in range(n) if stores and states[t] is not None and states[t].status == DONE and t not in have]
    todo = [t for t in range(n) if states[t] is None or states[t].status != DONE or t in lost]
    room = capture_room(cfg, todo)
    claim_run_dir(cfg, force=args.force)
    save_config(cfg, run_dir)  # the tasks read slurm.max_attempts etc. from RUN/config.yaml
    if not todo:
        print(f"all {n} tasks of {run_dir} are done; nothing to submit.")
        return 0
    if room:
        print(room, file=sys.stderr)
    if lost:
        print(
            f"task(s) {', '.join(map(str, lost))} finished, but their stores are gone (deleted or moved?): extracting again"
        )
    sub = submit_tasks(cfg, run_dir, todo, kind="extract", executor=which)
    if which == "local":
        print(local_summary(sub))
    else:
        arrays = arrays_of(read_submissions(run_dir), sub)
        print(
            f"submitted Slurm {'arrays ' + ', '.join(arrays) if len(arrays) > 1 else 'array ' + sub.job_id}: "
            f"{len(todo)} task(s) of {n}, at most {cfg.slurm.array_parallelism} at once; logs under "
            f"{run_dir}/slurm/{sub.job_id}_*/" + (" (and the other arrays')" if len(arrays) > 1 else "")
        )
    if args.then_train:
        _then_train(args, cfg, train_cfgs, sub.job_id)
    print(f"follow with: eagle-batch status {run_dir}")
    if args.wait:
        from eagle_batch.launch.follow import follow

        final = follow(run_dir, args.interval, live=not args.no_progress)
        return 0 if final["totals"]["all_done"] else 1
    return 0


def _training_configs(args: argparse.Namespace, cfg) -> list:
    """The task configs of `--then-train`, checked now: a bad train value must stop the command before the
    extraction is queued, not leave it queued with no training after it."""
    from eagle_batch.cli.train import followed_steps, sweep_configs, task_ranks

    files, overrides = config_sources(args)
    cfgs = sweep_configs(cfg, files, overrides)
    return [followed_steps(c, task_ranks(c)) if c.train.follow else c for c in cfgs]


def _then_train(args: argparse.Namespace, cfg, train_cfgs: list, array_job: str) -> None:
    """The training array of `eagle-batch train CONFIG --after RUN`, depending (afterok) on this array."""
    from eagle_batch.launch.submit import SubmitError
    from eagle_batch.launch.train_job import submit_training

    try:
        sub, ids = submit_training(train_cfgs, after=cfg.run_dir)
    except SubmitError as e:
        files, _ = config_sources(args)
        raise SubmitError(
            f"the extraction array {array_job} is queued but submitting training failed ({e}); submit it later "
            f"with `eagle-batch train {' '.join(files)} --after {cfg.run_dir}`."
        ) from None
    print(f"submitted {len(ids)} training task(s): {', '.join(ids)} (after {sub.dependency or 'nothing'})")

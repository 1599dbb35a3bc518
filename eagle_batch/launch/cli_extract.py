"""`eagle-batch extract CONFIG [key=value ...] [--wait] [--then-train]`: submit the extraction array."""

from __future__ import annotations

import argparse
import os
import sys

from eagle_batch.cli_common import add_config_arguments, config_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--wait", action="store_true", help="follow the array to the end with a live progress line")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between progress updates (--wait)")
    p.add_argument(
        "--then-train",
        action="store_true",
        help="also submit `eagle-batch train CONFIG` with an afterok dependency on the array",
    )
    p.add_argument("--force", action="store_true", help="reuse a run_dir whose config.yaml has a different data config")


def run(args: argparse.Namespace) -> int:
    from eagle_batch.config import check_config, check_prepared_fits, check_values, claim_run_dir, save_config
    from eagle_batch.data import PreparedDataset

    from .local import local_summary
    from .state import DONE, read_state
    from .submit import SubmitError, live_tasks, plan_num_tasks, resolve_executor, submit_tasks
    from .task import TEST_WORK_ENV

    cfg = config_from_args(args)
    # The test-only work function needs no model; the real one gets every check before anything is queued.
    if os.environ.get(TEST_WORK_ENV):
        check_values(cfg)
    else:
        check_config(cfg)
    run_dir = cfg.run_dir
    try:
        n = plan_num_tasks(run_dir)
        if not os.environ.get(TEST_WORK_ENV):
            prepared = PreparedDataset(run_dir)
            check_prepared_fits(cfg, prepared.max_sample_tokens(), str(prepared.dir))
        live = live_tasks(run_dir)
        if live:
            raise SubmitError(
                f"{run_dir} already has {len(live)} task(s) queued or running (jobs "
                f"{', '.join(sorted(set(live.values()))[:5])}). Nothing was submitted. Follow them "
                f"with `eagle-batch status {run_dir}`, or `eagle-batch cancel {run_dir}` first."
            )
        claim_run_dir(cfg, force=args.force)
        save_config(cfg, run_dir)  # the tasks read slurm.max_attempts etc. from RUN/config.yaml
        todo = [t for t in range(n) if (st := read_state(run_dir, t)) is None or st.status != DONE]
        if not todo:
            print(f"all {n} tasks of {run_dir} are done; nothing to submit.")
            return 0
        which = resolve_executor(cfg)
        sub = submit_tasks(cfg, run_dir, todo, kind="extract", executor=which)
    except SubmitError as e:
        print(f"eagle-batch extract: {e}", file=sys.stderr)
        return 1
    if which == "local":
        print(local_summary(sub))
    else:
        print(
            f"submitted Slurm array {sub.job_id}: {len(todo)} task(s) of {n}, "
            f"at most {cfg.slurm.array_parallelism} at once; logs under {run_dir}/slurm/{sub.job_id}_*/"
        )
    if args.then_train:
        # Exactly `eagle-batch train CONFIG [overrides] --after RUN`: the train CLI owns the training
        # array (sweeps, one rank per GPU); it depends (afterok) on the array just submitted.
        from eagle_batch.cli import main as cli_main

        argv = ["train", args.config, *args.overrides, "--after", str(run_dir)]
        print(f"eagle-batch {' '.join(argv)}")
        rc = cli_main(argv)
        if rc != 0:
            print(
                f"eagle-batch extract: the extraction array {sub.job_id} is queued but submitting training "
                f"failed (exit {rc}); submit it later with `eagle-batch train {args.config} --after {run_dir}`.",
                file=sys.stderr,
            )
            return rc
    print(f"follow with: eagle-batch status {run_dir}")
    if args.wait:
        from .follow import follow

        final = follow(run_dir, args.interval)
        return 0 if final["totals"]["all_done"] else 1
    return 0

"""`eagle-batch train CONFIG [CONFIG ...] [key=value ...]`: train EAGLE-3 drafts, here or as a Slurm array.

- One task per entry of `train.sweep` (a list of override dicts; none = one task). Each task writes to
  RUN/train/<train.name> (sweep tasks get `<name>-<i>` unless the entry sets train.name).
- `--local`, or no Slurm (`slurm.executor`, as `extract` chooses): the tasks run one after another here;
  `--nproc N` runs each with N DDP ranks.
- Slurm: one array (`launch.train_job`); `--after RUN` adds `afterok` on RUN's unfinished extraction
  arrays, and the first task to start aggregates the stores.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import sys

from eagle_batch.cli.common import add_config_arguments, config_from_args, config_sources
from eagle_batch.config import RunConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--local", action="store_true", help="run here instead of submitting to Slurm")
    p.add_argument("--nproc", type=int, default=1, help="--local: DDP ranks per task (default 1)")
    p.add_argument(
        "--after",
        metavar="RUN",
        default="",
        help="Slurm: start after RUN's extraction arrays succeed (afterok); aggregates first",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="pipelined: train while RUN's extraction still runs, each epoch over the samples committed when it "
        "began (= train.follow=true; train.epochs become steps over the prepared data)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the task configurations and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or lines (= train.progress=false)")


def _flatten(d: dict) -> list[str]:
    """A sweep entry as key=value overrides (an empty dict sets nothing, so it gives none)."""
    from eagle_batch.config import dotted_leaves

    return [
        f"{key}={json.dumps(v) if isinstance(v, (list, bool)) or v is None else v}"
        for key, v in dotted_leaves(d).items()
        if v != {}
    ]


def sweep_configs(base: RunConfig, files: list[str], overrides: list[str]) -> list[RunConfig]:
    """One resolved RunConfig per entry of base.train.sweep (the sweep itself cleared in each), each through
    the config's value checks: a sweep entry may set a nonsense value, and it must fail before any data is
    loaded or anything is submitted."""
    from eagle_batch.config import check_values, load_config

    sweep = list(base.train.sweep or [])
    if not sweep:
        cfgs = [copy.deepcopy(base)]
    else:
        cfgs = [load_config(files, list(overrides) + _entry_overrides(base, i, e)) for i, e in enumerate(sweep)]
    for c in cfgs:
        check_values(c)
    return cfgs


def _entry_overrides(base: RunConfig, i: int, entry: dict) -> list[str]:
    """The overrides of sweep entry `i`: its own, a task name of its own unless it sets one, no sweep."""
    ov = _flatten(dict(entry))
    if not any(o.startswith("train.name=") for o in ov):
        ov.append(f"train.name={base.train.name}-{i}")
    return ov + ["train.sweep=[]"]


def untrained_note(cfg: RunConfig) -> str:
    """The line that says a task trains nothing (train.steps=0, no epochs): it exports the initial draft."""
    tc = cfg.train
    if tc.steps or tc.epochs:
        return ""
    return (
        f"eagle-batch train: {tc.name}: train.steps=0 trains nothing; the initial (untrained) draft is "
        "exported, a baseline to compare trained drafts with."
    )


def stale_index_note(data_dir: str) -> str:
    """A warning when data_dir's dataset.json leaves out task stores that finished after it was written."""
    from eagle_batch.store.aggregate import not_indexed

    missing = not_indexed(data_dir)
    if not missing:
        return ""
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return (
        f"eagle-batch train: warning: {data_dir}/dataset.json does not list {len(missing)} task store(s) that "
        f"finished since it was written ({shown}); the training leaves them out. Run `eagle-batch aggregate "
        f"{data_dir}` first to train on them too."
    )


def task_configs(args: argparse.Namespace) -> list[RunConfig]:
    files, overrides = config_sources(args)
    overrides += ["train.progress=false"] * args.no_progress
    overrides += ["train.follow=true"] * args.follow
    cfgs = sweep_configs(config_from_args(args, overrides), files, overrides)
    return [followed_steps(c, task_ranks(c, args.local, args.nproc)) if c.train.follow else c for c in cfgs]


def write_loss_token_counts(cfg: RunConfig, prepared) -> None:
    """The loss-token counts of every prepared sample, in the draft's folder (train.inputs.LOSS_TOKEN_COUNTS):
    a pipelined draft's vocabulary then comes from all the data, not from the samples committed first."""
    import numpy as np

    from eagle_batch.config import model_info
    from eagle_batch.store.durable import write_atomic
    from eagle_batch.train.inputs import LOSS_TOKEN_COUNTS
    from eagle_batch.train.trainer import output_dir

    out = output_dir(cfg)
    if (out / "checkpoints").is_dir():
        return  # a resume: the vocabulary is in the checkpoint
    vocab = model_info(cfg.model.path).vocab_size
    counts = np.zeros(vocab, dtype=np.int64)
    for t in range(prepared.num_tasks):
        for s in prepared.task_samples(t):
            counts += np.bincount(s.input_ids[s.loss_mask.astype(bool)], minlength=vocab)[:vocab]
    out.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.save(buf, counts, allow_pickle=False)
    write_atomic(out / LOSS_TOKEN_COUNTS, [buf.getvalue()], fsync=False)


def task_ranks(cfg: RunConfig, local: bool = False, nproc: int = 1) -> int:
    """The data-parallel ranks of one training task: --nproc here, one per GPU of a Slurm task."""
    if local or not cfg.slurm.gpus_per_node:
        return max(1, nproc)
    return cfg.slurm.gpus_per_node * cfg.slurm.nodes


def followed_steps(cfg: RunConfig, world: int) -> RunConfig:
    """A pipelined task's steps: train.epochs over the prepared data (all of it once extracted, held-out
    samples left out), so it trains as many steps as the same training after extraction would."""
    from eagle_batch.data.dataset import PreparedDataset
    from eagle_batch.train.data import BatchPlan, trained_lengths
    from eagle_batch.train.follow import is_heldout

    tc = cfg.train
    import numpy as np

    prepared = PreparedDataset(cfg.run_dir)
    write_loss_token_counts(cfg, prepared)
    if tc.epochs <= 0:
        return cfg
    ids, lengths = prepared.sample_lengths()
    keep = np.array([not is_heldout(s, tc.holdout_fraction) for s in ids], dtype=bool)
    lengths = trained_lengths(lengths[keep], tc.max_length)
    per_epoch = BatchPlan(lengths, tc.batch_tokens, tc.seed, world).steps_per_epoch()
    out = copy.deepcopy(cfg)
    out.train.steps, out.train.epochs = tc.epochs * per_epoch, 0
    print(
        f"eagle-batch train: {tc.name}: --follow trains {out.train.steps} steps ({tc.epochs} epoch(s) of the "
        f"{int(keep.sum())} prepared samples at {per_epoch} steps each)",
        file=sys.stderr,
    )
    return out


def run(args: argparse.Namespace) -> int:
    from eagle_batch.launch.submit import resolve_executor

    cfgs = task_configs(args)
    for note in filter(None, map(untrained_note, cfgs)):
        print(note, file=sys.stderr)
    if not args.after:  # with --after, the job aggregates once the extraction is done
        for note in filter(None, map(stale_index_note, {c.train.data or c.run_dir for c in cfgs})):
            print(note, file=sys.stderr)
    if args.dry_run:
        for c in cfgs:
            row = {"name": c.train.name, "run_dir": c.run_dir, "lr": c.train.lr, "ttt_steps": c.train.ttt_steps}
            print(json.dumps(row | {"steps": c.train.steps}))
        return 0
    use_slurm = not args.local and resolve_executor(cfgs[0]) == "slurm"
    if args.after and not use_slurm:
        print(
            "eagle-batch train: --after needs Slurm (sbatch on PATH with a controller that answers, "
            "slurm.executor=slurm or auto); without it, run `eagle-batch train` once the extraction has finished.",
            file=sys.stderr,
        )
        return 2
    if use_slurm:
        from eagle_batch.launch.train_job import submit_training

        _, ids = submit_training(cfgs, after=args.after)
        print(
            f"submitted {len(ids)} training task(s): {', '.join(ids)}"
            + (f" (after {args.after})" if args.after else "")
        )
        return 0
    from eagle_batch.launch.local_train import run_local

    rc = 0
    for c in cfgs:
        r = run_local(c, args.nproc)
        print(json.dumps(r))
        rc = rc or (0 if r.get("status") == "done" else 1)
    if len(cfgs) > 1:  # a sweep: its drafts ranked (what `eagle-batch drafts RUN` prints)
        from pathlib import Path

        from eagle_batch.cli.drafts import draft_rows

        names = {c.train.name for c in cfgs}
        for i, row in enumerate((r for r in draft_rows(Path(cfgs[0].run_dir)) if r["name"] in names), 1):
            print(f"rank {i}: " + json.dumps(row), file=sys.stderr)
    return rc

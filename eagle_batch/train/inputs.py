"""What a training reads, decided once at start: `training_inputs(cfg, dataset, out, rank, world, note)`.

- After extraction (default): the aggregated run (or `train.data`), all of it at every epoch.
- Pipelined (`train.follow`): the run's task stores as extraction writes them (train/follow.py); the draft's
  vocabulary and the data checks see the samples committed when training starts.
Either way the held-out samples (`train.holdout_fraction`) are left out of every epoch and scored at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eagle_batch.config.load import ConfigError

from .checkpoint import latest_checkpoint
from .data import BatchPlan, TrainingData, trained_lengths
from .follow import FollowPlan, TrainSubset, is_heldout


def resolve_layers(cfg, stored_layer_ids: list[int]) -> tuple[list[int], int]:
    """(aux layer ids in ascending order, last layer id N): aux = stored ids other than N, or
    train.aux_layer_ids.

    Ascending because that is the order in which vLLM hands the aux states to the draft's fc, whatever the
    order of `eagle_aux_hidden_state_layer_ids` (0.32 sorts the set; 0.26 appends each as its layer loop
    passes it): fc trained on another order would see its input blocks swapped at serving time."""
    from eagle_batch.config import ConfigError, model_info

    n = model_info(cfg.model.path).num_hidden_layers
    aux = list(cfg.train.aux_layer_ids) if cfg.train.aux_layer_ids else [i for i in stored_layer_ids if i != n]
    if n not in stored_layer_ids:
        raise ConfigError(
            f"the training data has layers {stored_layer_ids} but not the last layer {n} "
            "(its states give the training targets); re-extract with it in model.layer_ids."
        )
    if len(set(aux)) != len(aux) or n in aux:
        raise ConfigError(
            f"train.aux_layer_ids={aux}: list each layer once and leave out the last layer {n} (its state "
            "gives the targets; vLLM never feeds it to the draft)"
        )
    return sorted(aux), n


@dataclass
class TrainingInputs:
    """`checks`: the data the vocabulary and the fit checks read; `data`: what the loader reads (indices as
    `plan` gives them); `plan`: rank_batches(epoch, rank) / steps_per_epoch(); `follow`: set when pipelined;
    `heldout`: (indices, lengths) to score at the end (pipelined: taken again at the end)."""

    checks: TrainingData
    data: TrainingData
    plan: Any
    follow: FollowPlan | None
    heldout: tuple[np.ndarray, np.ndarray]
    total_steps: int
    size: tuple[int, int]  # (samples, tokens up to train.max_length) of `checks`, for the start-up line


def _total_steps(tc, steps_per_epoch: int) -> int:
    return tc.epochs * steps_per_epoch if tc.epochs > 0 else tc.steps


def load_dataset(cfg, dataset: TrainingData | None) -> TrainingData:
    """The aggregated run (or train.data), refused when it holds no committed sample."""
    tc = cfg.train
    if dataset is None:
        from eagle_batch.store import open_dataset

        dataset = open_dataset(tc.data or cfg.run_dir)
    if len(dataset) == 0:
        from eagle_batch.store import StoreError

        raise StoreError(
            f"{tc.data or cfg.run_dir} holds no committed samples: there is nothing to train on. "
            f"Check `eagle-batch status {cfg.run_dir}` (did extraction run and finish?), then "
            "`eagle-batch aggregate` again."
        )
    return dataset


def training_inputs(cfg, dataset: TrainingData | None, out: Path, rank: int, world: int, note) -> TrainingInputs:
    tc = cfg.train
    if tc.follow:
        return _followed(cfg, out, rank, world, note)
    dataset = load_dataset(cfg, dataset)
    lengths = trained_lengths(dataset.lengths(), tc.max_length)
    held = np.zeros(len(lengths), dtype=bool)
    if tc.holdout_fraction > 0:
        held = np.array([is_heldout(dataset.sample_id(i), tc.holdout_fraction) for i in range(len(lengths))])
    idx = np.arange(len(lengths), dtype=np.int64)
    plan: Any = BatchPlan(lengths[~held], tc.batch_tokens, tc.seed, world)
    if held.any():
        plan = TrainSubset(plan, idx[~held])
    total = _total_steps(tc, plan.steps_per_epoch())
    size = (len(lengths), int(lengths.sum()))
    return TrainingInputs(dataset, dataset, plan, None, (idx[held], lengths[held]), total, size)


def _followed(cfg, out: Path, rank: int, world: int, note) -> TrainingInputs:
    from eagle_batch.store.follow import RunStores

    tc = cfg.train
    if tc.epochs > 0 or tc.steps < 1:
        raise ConfigError(
            f"train.follow=true trains train.steps steps (got steps={tc.steps}, epochs={tc.epochs}): the dataset "
            "grows while it trains, so epochs do not fix its length. `eagle-batch train --follow` converts "
            "train.epochs into steps over the prepared data; set train.steps when calling train() directly."
        )
    stores = RunStores(tc.data or cfg.run_dir, cfg.extract.num_tasks)
    plan = FollowPlan(stores, out, rank, world, tc, note=note)
    # A fresh training waits here for epoch 0's snapshot; a resumed one plans from its checkpoint's.
    snap = stores.snapshot() if latest_checkpoint(out) is not None else plan.epoch_snapshot(0)
    if not snap.num_samples:
        snap = plan.epoch_snapshot(0)
    lengths = trained_lengths(stores.ids_and_lengths(snap)[1], tc.max_length)
    size = (len(lengths), int(lengths.sum()))
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    return TrainingInputs(stores.view(snap), stores, plan, plan, none, tc.steps, size)


def heldout_of(inputs: TrainingInputs) -> tuple[np.ndarray, np.ndarray]:
    """The held-out (indices, lengths) to score now: pipelined, those of everything committed by now."""
    if inputs.follow is None:
        return inputs.heldout
    stores = inputs.follow.stores
    ids, lengths = stores.ids_and_lengths(stores.snapshot())
    mask = inputs.follow.heldout_mask(ids)
    return ids[mask], lengths[mask]


def follow_state(inputs: TrainingInputs | None, epoch: int) -> dict:
    """Pipelined: the checkpoint's copy of the snapshot that defines `epoch` (a resume plans it from this)."""
    follow = inputs.follow if inputs is not None else None
    return {"follow_snapshot": follow.epoch_snapshot(epoch).to_json()} if follow is not None else {}


# Written by `eagle-batch train --follow` into the draft's folder before training: the loss-token counts of
# every prepared sample, so a pipelined draft's vocabulary is chosen from all the data, not the first commits.
LOSS_TOKEN_COUNTS = "loss_token_counts.npy"


def prepared_loss_token_counts(out: Path, vocab_size: int) -> np.ndarray | None:
    """The counts `train --follow` wrote (None when absent: the vocabulary then comes from the first snapshot)."""
    p = Path(out) / LOSS_TOKEN_COUNTS
    if not p.is_file():
        return None
    counts = np.load(p, allow_pickle=False)
    if counts.ndim != 1 or len(counts) != vocab_size:
        raise ConfigError(f"{p} counts {counts.shape} tokens, not the target's {vocab_size}; delete it and rerun")
    return counts.astype(np.int64)

"""The store spec a run's capture tasks write with, and the check that existing task stores still match it.

A task reopens its store to append; a store written under another model or data config (RUN/config.yaml
edited since the task started, or a store copied in from another run) makes every attempt of the task fail
on StoreMismatchError. `resume` checks the stores of the tasks it is about to resubmit, before submitting.
"""

from __future__ import annotations

from eagle_batch.config import ConfigError, RunConfig, model_info, resolve_layer_ids
from eagle_batch.store import StoreError, StoreSpec
from eagle_batch.store.format import read_attrs

from .state import store_path


def store_spec(cfg: RunConfig) -> StoreSpec:
    """The StoreSpec for this run: the same layer ids and hidden size capture resolves from the config."""
    info = model_info(cfg.model.path)
    return StoreSpec.from_config(cfg, resolve_layer_ids(cfg.model, info), info.hidden_size, info.num_hidden_layers)


def check_stores_match(cfg: RunConfig, tasks: list[int]) -> None:
    """ConfigError naming the first store of `tasks` written with another model or config than cfg gives."""
    if cfg.extract.work != "capture":
        return
    spec = None
    for t in tasks:
        path = store_path(cfg.run_dir, t)
        if not (path / "zarr.json").is_file():
            continue
        try:
            stored = StoreSpec.from_attributes(read_attrs(path))
        except (StoreError, TypeError, ValueError):
            continue  # a damaged store: `verify` names it, and the task's repair or a new store handles it
        spec = spec or store_spec(cfg)
        differ = spec.mismatches(stored)
        if differ:
            raise ConfigError(
                f"{path} was written with another model or config than {cfg.run_dir}/config.yaml now gives "
                f"({'; '.join(d.replace('writer has', 'config.yaml gives') for d in differ)}): config.yaml was "
                "changed since the task started. Restore the settings the run was extracted with, or delete "
                "the store to recompute that task. Nothing was submitted."
            )

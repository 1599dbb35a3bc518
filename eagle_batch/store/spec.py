"""What a task store holds (StoreSpec), its errors, and the per-store writer lock."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle_batch.errors import UserError

from .format import LAYER_SEMANTICS, LOCK_NAME


class StoreError(UserError, RuntimeError):
    """Base class of store errors; messages name the store (and shard/field) and what to do."""


class StoreLockedError(StoreError):
    """Another process holds the store's writer lock."""


class StoreMismatchError(StoreError):
    """An existing store was written with a different spec or layout than the one asked for."""


class StoreCorruptError(StoreError):
    """Committed data is missing or damaged."""


@dataclass
class StoreSpec:
    """The fixed description of a store's contents, saved as the Zarr group's attributes.

    `layer_ids[j]` is the layer whose states are `hidden_states[:, j]` (semantics in `layer_semantics`).
    """

    layer_ids: list[int]
    hidden_size: int
    model_name: str = ""
    model_revision: str = ""
    tokenizer: str = ""
    config_hash: str = ""
    dtype: str = "bfloat16"
    layer_semantics: str = LAYER_SEMANTICS
    eagle_batch_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.layer_ids = [int(x) for x in self.layer_ids]
        self.hidden_size = int(self.hidden_size)
        if not self.layer_ids:
            raise ValueError("StoreSpec.layer_ids is empty; pass the captured layer ids (e.g. [2, 15, 27, 30]).")
        if self.hidden_size <= 0:
            raise ValueError(f"StoreSpec.hidden_size={self.hidden_size} must be positive (the model's hidden size).")
        if self.dtype != "bfloat16":
            raise ValueError(f"StoreSpec.dtype={self.dtype!r}: only bfloat16 hidden states are stored.")
        if not self.eagle_batch_version:
            from eagle_batch import __version__

            self.eagle_batch_version = __version__

    @property
    def num_layers(self) -> int:
        return len(self.layer_ids)

    def attributes(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_attributes(cls, attrs: dict[str, Any]) -> "StoreSpec":
        known = {k: attrs[k] for k in cls.__dataclass_fields__ if k in attrs}
        return cls(**known)

    @classmethod
    def from_config(cls, cfg, layer_ids: list[int], hidden_size: int) -> "StoreSpec":
        """Spec for a run: model name/revision/tokenizer from cfg.model, hash of the data sections."""
        from eagle_batch.config import config_hash

        m = cfg.model
        return cls(
            layer_ids=list(layer_ids),
            hidden_size=hidden_size,
            model_name=m.name or Path(m.path).name,
            model_revision=m.revision,
            tokenizer=m.tokenizer or m.path,
            config_hash=config_hash(cfg),
        )

    # Fields that must agree between an existing store and a writer resuming it.
    IDENTITY = ("layer_ids", "hidden_size", "dtype", "model_name", "model_revision", "config_hash")

    def mismatches(self, other: "StoreSpec") -> list[str]:
        return [
            f"{k}: store has {getattr(other, k)!r}, writer has {getattr(self, k)!r}"
            for k in self.IDENTITY
            if getattr(self, k) != getattr(other, k)
        ]


def holder_info() -> dict[str, Any]:
    env = os.environ
    job = env.get("SLURM_JOB_ID", "")
    if env.get("SLURM_ARRAY_JOB_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')} (job id {job})"
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job": job,
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class StoreLock:
    """Exclusive `flock` on STORE/.lock; the file's content names the holder (for the error message).

    flock locks die with the process, so a SIGKILLed writer never leaves a stale lock. On network file
    systems flock must be supported (Lustre: mount with `flock`; NFSv4 maps it to byte-range locks).
    """

    def __init__(self, store: Path):
        self.path = store / LOCK_NAME
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(self.fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            os.close(self.fd)
            who = (
                f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
                f"Slurm job {holder.get('slurm_job') or 'none'}, since {holder.get('since', '?')}"
            )
            raise StoreLockedError(
                f"{store} is being written by another process ({who}). Only one writer per store is "
                "allowed: wait for that task to finish, or cancel it (`scancel JOB` / kill the pid) and "
                "retry; the lock is released automatically when the holder exits."
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(holder_info()).encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            try:
                os.ftruncate(self.fd, 0)
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
                self.fd = -1

"""What a task store holds (StoreSpec): layer ids, hidden size and the attributes that identify the run.

The store's exceptions are in errors.py and its writer lock in lock.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .format import HIDDEN_DTYPES, LAYER_SEMANTICS


@dataclass
class StoreSpec:
    """The fixed description of a store's contents, saved as the Zarr group's attributes.

    `layer_ids[j]` is the layer whose states are `hidden_states[:, j]` (semantics in `layer_semantics`, which
    refer to `num_hidden_layers`, N: 0 where the writer did not know it). `tokenizer` names the tokenizer
    (a folder or hub name, never a host path) and `tokenizer_sha256` identifies its files
    (`eagle_batch.config.tokenizer_sha256`; docs/reference/store-format.md gives the recipe). `dtype` (store.dtype) is how
    the states are stored: `bfloat16` (the model's bits), `float8_e4m3` or `float8_e5m2` (codes and a scale
    per row, store/fp8.py).
    """

    layer_ids: list[int]
    hidden_size: int
    model_name: str = ""
    model_revision: str = ""
    tokenizer: str = ""
    tokenizer_sha256: str = ""
    num_hidden_layers: int = 0
    config_hash: str = ""
    dtype: str = "bfloat16"
    layer_semantics: str = LAYER_SEMANTICS
    eagle_batch_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.layer_ids = [int(x) for x in self.layer_ids]
        self.hidden_size = int(self.hidden_size)
        self.num_hidden_layers = int(self.num_hidden_layers)
        if not self.layer_ids:
            raise ValueError("StoreSpec.layer_ids is empty; pass the captured layer ids (e.g. [2, 15, 27, 30]).")
        if self.hidden_size <= 0:
            raise ValueError(f"StoreSpec.hidden_size={self.hidden_size} must be positive (the model's hidden size).")
        if self.dtype not in HIDDEN_DTYPES:
            raise ValueError(
                f"store.dtype={self.dtype!r} is not a hidden-state dtype eagle-batch stores; "
                f"use one of {', '.join(HIDDEN_DTYPES)}."
            )
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
    def from_config(cls, cfg, layer_ids: list[int], hidden_size: int, num_hidden_layers: int = 0) -> "StoreSpec":
        """Spec for a run: model name/revision/tokenizer from cfg.model, hash of the data sections."""
        from eagle_batch.config import config_hash, tokenizer_sha256

        m = cfg.model
        tok = Path(m.tokenizer or m.path)
        return cls(
            layer_ids=list(layer_ids),
            hidden_size=hidden_size,
            model_name=m.name or Path(m.path).name,
            model_revision=m.revision,
            tokenizer=tok.name,
            tokenizer_sha256=tokenizer_sha256(tok),
            num_hidden_layers=num_hidden_layers,
            config_hash=config_hash(cfg),
            dtype=cfg.store.dtype,
        )

    # Fields that must agree between an existing store and a writer resuming it.
    IDENTITY = ("layer_ids", "hidden_size", "dtype", "model_name", "model_revision", "config_hash")

    def mismatches(self, other: "StoreSpec") -> list[str]:
        return [
            f"{k}: store has {getattr(other, k)!r}, writer has {getattr(self, k)!r}"
            for k in self.IDENTITY
            if getattr(self, k) != getattr(other, k)
        ]

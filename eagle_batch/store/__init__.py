"""The hidden-state store: one Zarr v3 task store per array task, crash-safe commits, readers.

- `TaskStoreWriter.open(path, spec, store_cfg)`: the single writer of a task store (writer.py).
- `open_dataset(path)`: samples of a task store or an aggregated run (source.py, reader.py).
- `aggregate(run_dir)`: RUN/dataset.json over the complete task stores (aggregate.py).
- `verify(path) -> list[Problem]`: checksums, offsets, dtypes, values, metadata (verify.py).
- `StoreWriterProtocol`: what the capture needs from a writer (protocol.py).
- `store.dtype: float8_e4m3 | float8_e5m2`: float8 codes and a float32 scale per row instead of bf16
  (fp8.py: the quantization, `Fp8Rows`); readers return bf16 either way.
Format: docs/reference/store-format.md; names and layouts: format.py; a shard file's bytes: shard_codec.py.
"""

# Imported eagerly, not through lazy wrappers: a wrapper named like its submodule is replaced by the module
# object as soon as anything imports `eagle_batch.store.verify` (recovery.py does, for repairs), after which
# `from eagle_batch.store import verify; verify(path)` would raise "'module' object is not callable".
from .aggregate import aggregate  # noqa: E402
from .errors import StoreCorruptError, StoreError, StoreLockedError, StoreMismatchError
from .format import LAYER_SEMANTICS
from .protocol import StoreWriterProtocol
from .reader import StoreDataset, TaskStore, read_record
from .record import committed_samples_of_shard
from .source import open_dataset
from .spec import StoreSpec
from .verify import verify  # noqa: E402
from .writer import TaskStoreWriter, hidden_states_to_uint16

__all__ = [
    "LAYER_SEMANTICS",
    "StoreCorruptError",
    "StoreDataset",
    "StoreError",
    "StoreLockedError",
    "StoreMismatchError",
    "StoreSpec",
    "StoreWriterProtocol",
    "TaskStore",
    "TaskStoreWriter",
    "aggregate",
    "committed_samples_of_shard",
    "hidden_states_to_uint16",
    "open_dataset",
    "read_record",
    "verify",
]

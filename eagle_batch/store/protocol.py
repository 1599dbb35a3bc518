"""What the capture needs from a store writer: `StoreWriterProtocol`.

The capture (`eagle_batch.capture`: `run_capture`, its `WriterThread`) skips the samples a store has
committed, appends captured states one sample or one block of back-to-back samples at a time, lending the
memory (`on_release`), and commits. `TaskStoreWriter` is the implementation; a test writer (or another
store) that provides these four members can stand in for it. Runtime-checkable: `isinstance(w,
StoreWriterProtocol)` checks that the members exist (not their signatures; tests/store/test_protocol.py
compares those for TaskStoreWriter).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class StoreWriterProtocol(Protocol):
    @property
    def committed_sample_ids(self) -> Set[str]:
        """Ids of the samples in the committed record (what survives a crash): the capture skips them."""
        ...

    def append(
        self,
        sample_id: str,
        input_ids: Any,
        loss_mask: Any,
        hidden_states: Any,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        """Queue one sample (`hidden_states`: bf16 [T, L, H], torch or numpy uint16 bits; for a float8 store
        also `store.fp8.Fp8Rows`, codes and scales quantized by the caller); durable only after
        the next commit(). With `on_release`, the states are lent: the writer may read them after append
        returned and calls `on_release()` exactly once (from any thread; also when append raises) when it
        no longer does."""
        ...

    def append_block(
        self,
        sample_ids: Sequence[str],
        input_ids: Sequence[Any],
        loss_masks: Sequence[Any],
        hidden_states: Any,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        """Queue consecutive samples whose states lie back to back in one [sum T, L, H] block, all or none;
        `on_release` as for append, for the block as a whole."""
        ...

    def commit(self) -> None:
        """Durability barrier: on return every appended sample is on disk and in the committed record."""
        ...

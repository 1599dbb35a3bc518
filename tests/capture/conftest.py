"""Helpers for the capture tests: an in-memory stand-in for the store's TaskStoreWriter and samples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch


@dataclass
class FakeSample:
    sample_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray


class FakeWriter:
    """Implements the TaskStoreWriter calls run_capture makes (architecture.md), in memory."""

    def __init__(self, committed=()):
        self.committed: dict[str, dict] = {sid: {} for sid in committed}
        self.pending: dict[str, dict] = {}
        self.commits = 0
        self.append_threads: set[str] = set()
        self.blocks: list[list[str]] = []  # sample ids of each append_block call

    @property
    def committed_sample_ids(self):
        return set(self.committed)

    def append(self, sample_id, input_ids, loss_mask, hidden_states, on_release=None):
        import threading

        try:
            if isinstance(hidden_states, np.ndarray):  # bf16 bits, as the real writer also takes them
                assert hidden_states.dtype == np.uint16
                hidden_states = torch.from_numpy(hidden_states).view(torch.bfloat16)
            assert isinstance(hidden_states, torch.Tensor) and hidden_states.dtype == torch.bfloat16
            assert sample_id not in self.pending and sample_id not in self.committed, sample_id
            self.append_threads.add(threading.current_thread().name)
            self.pending[sample_id] = dict(
                input_ids=np.asarray(input_ids).copy(),
                loss_mask=np.asarray(loss_mask).copy(),
                hidden_states=hidden_states.clone(),
            )
        finally:  # the store's contract: lent rows come back exactly once, also on failure
            if on_release is not None:
                on_release()

    def append_block(self, sample_ids, input_ids, loss_masks, hidden_states, on_release=None):
        """Consecutive samples' rows back to back (the real writer's contract); recorded per sample."""
        try:
            if isinstance(hidden_states, np.ndarray):
                assert hidden_states.dtype == np.uint16
                hidden_states = torch.from_numpy(hidden_states).view(torch.bfloat16)
            assert len(hidden_states) == sum(len(i) for i in input_ids)
            self.blocks.append(list(sample_ids))
            off = 0
            for sid, ids, mask in zip(sample_ids, input_ids, loss_masks):
                self.append(sid, ids, mask, hidden_states[off : off + len(ids)])
                off += len(ids)
        finally:
            if on_release is not None:
                on_release()

    def commit(self):
        self.committed.update(self.pending)
        self.pending = {}
        self.commits += 1


def make_samples(lengths, vocab=40000, seed=0, prefix="s"):
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        mask = (np.arange(n) >= n // 3).astype(np.uint8)
        out.append(FakeSample(f"{prefix}{i:04d}", rng.integers(10, vocab, size=n).astype(np.int32), mask))
    return out


@pytest.fixture(scope="session")
def fake_writer_cls():
    return FakeWriter


@pytest.fixture(scope="session")
def samples_factory():
    return make_samples

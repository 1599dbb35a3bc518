"""The training data path: store samples -> length-bucketed, token-budgeted, per-rank batches.

- `TrainSamples(ds, aux_layer_ids, last_layer_id, max_length)`: wraps a `TrainingData` (`open_dataset(RUN)`,
  or `InMemoryDataset` in tests) and returns per sample: input_ids int64 [T], loss_mask uint8 [T], aux bf16 [T, 3H]
  (the aux layers concatenated in the given order) and last bf16 [T, H] (layer N, pre-norm).
- `BatchPlan(lengths, batch_tokens, seed, world_size)`: a deterministic plan per epoch. Samples are
  shuffled (seeded by seed + epoch), sorted by length inside windows of 64 batches' worth (so padding is
  small and batches still mix), packed so that `max_len * count <= batch_tokens`, the batch order is
  shuffled, and batches are dealt round-robin to ranks (truncated to a multiple of world_size so every
  rank takes the same number of steps - DDP needs that). The data position is (epoch, batch index):
  rebuilding the plan for that epoch and skipping gives exactly the same order after a resume.
- `EpochLoader(...).stream(epoch, skip)`: the trainer's loader, one stream of batches running on across
  epoch boundaries; `make_loader(...)`: a DataLoader over one epoch's remaining batches. Both have
  workers, prefetch and pinned memory, so decode/collate runs in worker processes ahead of the step.
- `token_frequencies(ds)` / `build_vocab_map(freq, draft_vocab_size)`: draft vocabulary from the
  frequencies of the loss-masked tokens of the training data.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from eagle_batch.store.damage import DamagedSamples
from eagle_batch.store.errors import DamagedDataError


class TrainingData(Protocol):
    """What training reads: `eagle_batch.store.open_dataset`'s StoreDataset, or InMemoryDataset."""

    @property
    def layer_ids(self) -> list[int]: ...

    def __len__(self) -> int: ...

    def lengths(self) -> np.ndarray:
        """Tokens of every sample (for length-bucketed batches), without reading the samples."""

    def get_arrays(self, i: int) -> dict[str, Any]:
        """Sample i as numpy arrays: input_ids [T], loss_mask [T], hidden_states [T, L, H] as bf16's uint16 bits."""

    def token_arrays(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, loss_mask) of sample i, without its hidden states."""

    def sample_id(self, i: int) -> str:
        """The id of sample i (train.holdout_fraction picks held-out samples by it)."""

    def sources(self) -> dict[str, str]:
        """{store path: digest of its committed record} of the stores read (a trained draft records them)."""


def _bf16_bits(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
    return np.asarray(x, dtype=np.uint16)


class InMemoryDataset:
    """Samples held in memory (dicts of input_ids, loss_mask, hidden_states bf16 [T, L, H]), as TrainingData
    (tests, benchmarks)."""

    def __init__(self, samples: Sequence[dict], layer_ids: Sequence[int]):
        self.samples = list(samples)
        self.layer_ids = list(layer_ids)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        return self.samples[int(i)]

    def lengths(self) -> np.ndarray:
        return np.array([len(s["input_ids"]) for s in self.samples], dtype=np.int64)

    def get_arrays(self, i: int) -> dict[str, Any]:
        x = self.samples[int(i)]
        ids, lm = self.token_arrays(i)
        return {"input_ids": ids, "loss_mask": lm, "hidden_states": _bf16_bits(x["hidden_states"])}

    def token_arrays(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        x = self.samples[int(i)]
        return np.asarray(x["input_ids"]), np.asarray(x["loss_mask"], dtype=np.uint8)

    def sample_id(self, i: int) -> str:
        return str(self.samples[int(i)].get("sample_id", i))

    def sources(self) -> dict[str, str]:
        return {}  # held in memory: no store


class TrainSamples(Dataset):
    """`on_damaged` (train.on_damaged): a sample whose stored data fail their checksum comes back as
    {"damaged": DamagedDataError, "index": i}, which collate sets aside and the loader (main process) fails
    on or skips: an error raised in a DataLoader worker would reach the user wrapped in its traceback."""

    def __init__(
        self,
        ds: TrainingData,
        aux_layer_ids: Sequence[int],
        last_layer_id: int,
        max_length: int = 0,
        on_damaged: str = "fail",
    ):
        self.ds = ds
        self.on_damaged = on_damaged
        stored = list(ds.layer_ids)
        want = list(aux_layer_ids) + [int(last_layer_id)]
        missing = [x for x in want if x not in stored]
        if missing:
            from eagle_batch.config.load import ConfigError

            raise ConfigError(
                f"the training data holds layers {stored}; the draft needs {want} "
                f"(aux {list(aux_layer_ids)} + last {last_layer_id}); missing {missing}. "
                "Set train.aux_layer_ids to layers the data holds, or re-extract with model.layer_ids including them."
            )
        self.positions = [stored.index(x) for x in want]
        self.identity = self.positions == list(range(len(stored)))
        self.max_length = int(max_length)
        self._lengths: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ds)

    def lengths(self) -> np.ndarray:
        if self._lengths is None:
            self._lengths = trained_lengths(self.ds.lengths(), self.max_length)
        return self._lengths

    def __getitem__(self, i: int) -> dict:
        # hidden states arrive as uint16 bits and are viewed as bf16 without a copy
        try:
            x = self.ds.get_arrays(int(i))
        except DamagedDataError as e:
            return {"damaged": e, "index": int(i)}
        hs = torch.from_numpy(np.ascontiguousarray(x["hidden_states"])).view(torch.bfloat16)
        ids = torch.from_numpy(np.asarray(x["input_ids"]).astype(np.int64))
        lm = torch.from_numpy(np.asarray(x["loss_mask"], dtype=np.uint8))
        t = ids.shape[0] if not self.max_length else min(ids.shape[0], self.max_length)
        hs = hs[:t]
        if not self.identity:
            hs = hs[:, self.positions]
        n_aux = len(self.positions) - 1
        return {
            "input_ids": ids[:t],
            "loss_mask": lm[:t].to(torch.uint8),
            "aux": hs[:, :n_aux].reshape(t, -1),
            "last": hs[:, n_aux],
            "index": int(i),
        }


def collate(samples: list[dict]) -> dict:
    """Right-pad to the longest sample; padding has loss_mask 0 and input id 0. Damaged samples (TrainSamples)
    are left out and listed under "damaged" (only that key when the whole batch is damaged)."""
    damaged = [s["damaged"] for s in samples if "damaged" in s]
    if damaged:
        samples = [s for s in samples if "damaged" not in s]
        if not samples:
            return {"damaged": damaged}
        return {**collate(samples), "damaged": damaged}
    b = len(samples)
    t = max(s["input_ids"].shape[0] for s in samples)
    ha, hl = samples[0]["aux"].shape[-1], samples[0]["last"].shape[-1]
    out = {
        "input_ids": torch.zeros(b, t, dtype=torch.long),
        "loss_mask": torch.zeros(b, t, dtype=torch.uint8),
        "aux": torch.zeros(b, t, ha, dtype=torch.bfloat16),
        "last": torch.zeros(b, t, hl, dtype=torch.bfloat16),
        "lengths": torch.zeros(b, dtype=torch.long),
        "index": torch.tensor([s["index"] for s in samples], dtype=torch.long),
    }
    for j, s in enumerate(samples):
        n = s["input_ids"].shape[0]
        out["input_ids"][j, :n] = s["input_ids"]
        out["loss_mask"][j, :n] = s["loss_mask"]
        out["aux"][j, :n] = s["aux"]
        out["last"][j, :n] = s["last"]
        out["lengths"][j] = n
    return out


def trained_lengths(lengths, max_length: int) -> np.ndarray:
    """The tokens each sample trains on: its length, cut at `max_length` (0: no cut), as TrainSamples cuts it."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.minimum(lengths, max_length) if max_length else lengths


@dataclass
class BatchPlan:
    lengths: np.ndarray
    batch_tokens: int
    seed: int = 0
    world_size: int = 1
    window_batches: int = 64

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All batches of one epoch (every rank's), in global order; deterministic in (seed, epoch)."""
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.lengths)
        order = rng.permutation(n)
        mean_len = max(1.0, float(self.lengths.mean()) if n else 1.0)
        window = max(1, int(self.window_batches * self.batch_tokens / mean_len))
        batches: list[list[int]] = []
        for w in range(0, n, window):
            chunk = order[w : w + window]
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
            cur: list[int] = []
            cur_max = 0
            for i in chunk.tolist():
                li = int(self.lengths[i])
                new_max = max(cur_max, li)
                if cur and new_max * (len(cur) + 1) > self.batch_tokens:
                    batches.append(cur)
                    cur, new_max = [], li
                cur.append(i)
                cur_max = new_max
            if cur:
                batches.append(cur)
        perm = rng.permutation(len(batches))
        batches = [batches[i] for i in perm]
        usable = (len(batches) // self.world_size) * self.world_size
        if usable == 0 and batches:
            raise ValueError(
                f"only {len(batches)} batches per epoch for {self.world_size} ranks; lower "
                "train.batch_tokens or use fewer GPUs"
            )
        return batches[:usable]

    def rank_batches(self, epoch: int, rank: int) -> list[list[int]]:
        return self.epoch_batches(epoch)[rank :: self.world_size]

    def steps_per_epoch(self) -> int:
        return len(self.epoch_batches(0)) // self.world_size


class _PlannedBatches(torch.utils.data.Sampler):
    def __init__(self, batches: list[list[int]]):
        self.batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _loader_kwargs(num_workers: int, prefetch_factor: int) -> dict[str, Any]:
    if num_workers <= 0:
        return {}
    return dict(
        prefetch_factor=prefetch_factor,
        multiprocessing_context="fork" if torch.multiprocessing.get_start_method(True) in (None, "fork") else None,
    )


def make_loader(
    samples: TrainSamples,
    plan: BatchPlan,
    epoch: int,
    rank: int,
    skip: int = 0,
    num_workers: int = 4,
    prefetch_factor: int = 4,
    pin_memory: bool = False,
) -> DataLoader:
    """The rank's batches of `epoch` from batch `skip` on (the data position after a resume)."""
    batches = plan.rank_batches(epoch, rank)[skip:]
    return DataLoader(
        samples,
        batch_sampler=_PlannedBatches(batches),
        collate_fn=collate,
        num_workers=num_workers,
        pin_memory=pin_memory,
        **_loader_kwargs(num_workers, prefetch_factor),
    )


class _BatchStream(torch.utils.data.Sampler):
    """The rank's batches of epoch e from batch `skip` on, then of every later epoch, without end.

    Runs in the main process (DataLoader asks it for the next batch as workers free up), so it can
    note each batch's (epoch, index in epoch) in `positions`, in the order the loader returns them."""

    def __init__(self, plan: BatchPlan, rank: int, epoch: int, skip: int):
        self.plan, self.rank, self.epoch, self.skip = plan, rank, epoch, skip
        self.positions: collections.deque = collections.deque()

    def __iter__(self) -> Iterator[list[int]]:
        epoch, skip = self.epoch, self.skip
        while True:
            batches = self.plan.rank_batches(epoch, self.rank)
            if not batches:
                raise ValueError("no training batches: the dataset is empty or batch_tokens is too small")
            for i in range(skip, len(batches)):
                self.positions.append((epoch, i))
                yield batches[i]
            epoch, skip = epoch + 1, 0


class EpochLoader:
    """The trainer's loader: one stream of batches across epoch boundaries.

    A DataLoader per epoch restarts its workers and drains its prefetch queue at every epoch end, so each
    epoch starts by waiting for a worker to decode a whole batch (seconds at hidden 7168: a 16k-token batch
    is ~0.94 GB of states; docs/decisions/0019). Here the workers never stop and prefetching runs on into
    the next epoch.

        for epoch, batch_in_epoch, batch in EpochLoader(samples, plan, rank, 8).stream(epoch, skip): ...
    """

    def __init__(
        self,
        samples: TrainSamples,
        plan: BatchPlan,
        rank: int,
        num_workers: int = 4,
        prefetch_factor: int = 4,
        pin_memory: bool = False,
    ):
        self.samples, self.plan, self.rank = samples, plan, rank
        self.num_workers, self.prefetch_factor, self.pin_memory = num_workers, prefetch_factor, pin_memory
        self.damaged = DamagedSamples(samples.on_damaged, "eagle-batch train")

    def stream(self, epoch: int = 0, skip: int = 0) -> Iterator[tuple[int, int, dict]]:
        """(epoch, index of the batch in its epoch, batch) from batch `skip` of `epoch` on, without end."""
        order = _BatchStream(self.plan, self.rank, epoch, skip)
        loader = DataLoader(
            self.samples,
            batch_sampler=order,
            collate_fn=collate,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            **_loader_kwargs(self.num_workers, self.prefetch_factor),
        )
        it = iter(loader)
        try:
            for batch in it:
                e, i = order.positions.popleft()
                for err in batch.pop("damaged", ()):
                    self.damaged.handle(err, err.sample_id)  # fail: raises here, in the main process
                if "input_ids" in batch:  # else every sample of the batch was damaged and skipped
                    yield e, i, batch
        finally:
            _stop_workers(it)
            if self.damaged.skipped:
                print(self.damaged.summary(), file=sys.stderr, flush=True)


# The endings of torch's message for a data worker that died of a signal or vanished (an abort in native
# code, the OOM killer), after "DataLoader worker (pid ...". A sample that cannot be read is another
# message: torch re-raises the worker's own exception ("Caught ... in DataLoader worker process").
_WORKER_DEATHS = ("is killed by signal", "exited unexpectedly")


def is_worker_death(message: str) -> bool:
    """Whether an error's text is torch's report of a data worker that died, not of a sample it failed on."""
    return "DataLoader worker (pid" in message and any(f in message for f in _WORKER_DEATHS)


def _stop_workers(it: Any) -> None:
    """Stop a DataLoader iterator's workers now, not when it is collected.

    A worker that dies while it is being stopped (a native library aborting in the worker's exit) is
    reported by torch as a RuntimeError from the stop itself; every batch the consumer took had been
    read whole before, so it is a warning, not the training's failure (which would lose the export of a
    finished training); torch terminates the other workers either way. A worker that dies while batches are
    still being read is torch's error at the next batch."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is None:
        return
    try:
        shutdown()
    except RuntimeError as e:
        if not is_worker_death(str(e)):
            raise
        print(
            f"[eagle-batch train] warning: {e} (while its data workers were being stopped, after the last batch "
            "they read was taken; nothing is lost)",
            file=sys.stderr,
            flush=True,
        )


# ----------------------------------------------------------------------------------------------------
# Draft vocabulary


def token_frequencies(
    ds: TrainingData, vocab_size: int, max_samples: int = 0, damaged: DamagedSamples | None = None
) -> np.ndarray:
    """Counts of the tokens the draft must predict (loss_mask == 1) over the training data (reads only
    input_ids and loss_mask, no hidden states). A damaged sample fails, or is skipped by `damaged`."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    n = len(ds) if not max_samples else min(len(ds), max_samples)
    for i in range(n):
        try:
            ids, lm = ds.token_arrays(i)
        except DamagedDataError as e:
            (damaged or DamagedSamples()).handle(e, e.sample_id)
            continue
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        lm = np.asarray(lm).reshape(-1).astype(bool)
        np.add.at(counts, ids[lm], 1)
    return counts


def build_vocab_map(freq: np.ndarray, draft_vocab_size: int) -> torch.Tensor:
    """Sorted target ids of the draft vocabulary: the most frequent tokens (ties -> lower id), padded
    with the lowest unused ids when the data has fewer distinct tokens than draft_vocab_size."""
    v = len(freq)
    k = min(draft_vocab_size, v)
    order = np.lexsort((np.arange(v), -freq))  # by count desc, then id asc
    chosen = np.sort(order[:k])
    return torch.from_numpy(chosen.astype(np.int64))

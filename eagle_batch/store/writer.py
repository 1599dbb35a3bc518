"""TaskStoreWriter: append samples to one task store with crash-safe commits.

    with TaskStoreWriter.open(path, spec, cfg.store) as w:
        for s in samples:
            if s.sample_id in w.committed_sample_ids: continue
            w.append(s.sample_id, s.input_ids, s.loss_mask, hidden_states)  # torch bf16 [T, L, H] (or Fp8Rows)
            if time_to_commit: w.commit()
        w.finalize()

This module is the facade: it checks what it is given and keeps the order of the commit protocol; each
step's mechanics live in a module of their own (imports only go downwards, none back to this one):
lock.py (one writer), recovery.py (open: create, or back to the committed record), stream.py and ingest.py
(rows -> chunks -> shards on the compression and IO threads), shard_codec.py (a shard file's bytes),
record.py (progress.json), finalize.py (the complete state), durable.py (atomic, synced files).

Commit protocol (one writer per store, enforced by a flock):
1. append() cuts rows into inner chunks; full hidden_states chunks are compressed (and checksummed) on a
   thread pool, token-id and mask chunks (~1 KiB) by their shard's IO job, and full shards are written by
   IO threads (`<shard>.<uuid>.partial`, fsync, rename, fsync dir), so the producer only waits when it
   runs more than a few shards ahead of the disk. Rows are copied into a chunk buffer only where a chunk
   spans two samples: with `on_release` (the capture path) a chunk that lies inside one sample is
   compressed straight from the caller's memory, which is handed back once the last such chunk is encoded;
   the shard's raw crc32c is combined from the chunk crcs. With `store.adaptive` (blosc-zstd), a chunk
   that finds every compression slot taken while the disk keeps up (fewer than IO_QUEUE_RAW_LIMIT shards
   with all their chunks encoded waiting for the disk) is kept as an uncompressed blosc frame (16-byte
   header + the rows): the producer does not wait on compression unless it waits on the disk anyway, and
   the ratio reflects the CPU the node had spare (ingest.py).
2. `commit()` also writes the partially filled tail shard of each array (its already committed prefix
   is byte-identical), waits for every write, then atomically replaces `progress.json` (the committed
   record: samples, lengths, ids, per-shard size, crc32c of the file and of the raw rows). Only then
   are the `zarr.json` shapes advanced, so an array's shape never covers unwritten data.
3. `open()` of an existing store drops everything the record does not cover: `*.partial` files, shards
   past the record, and a tail shard rewritten by an interrupted commit (restored to its committed
   prefix after checking the prefix's raw crc32c) (recovery.py).
4. `finalize()` writes `offsets` and `sample_ids`, consolidates metadata, then the `complete` marker.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .durable import makedirs_durable
from .errors import StoreError
from .finalize import finalize_store
from .format import BF16, COMPLETE_NAME, SCALE_ARRAY, ArrayLayout, auto_chunk_tokens, hidden_row_nbytes
from .fp8 import Fp8Rows, float8, quantize
from .ingest import Ingest
from .loan import Loan
from .lock import StoreLock
from .record import write_shapes
from .recovery import committed_tail, open_store
from .spec import StoreSpec
from .trace import StoreTrace


def hidden_states_to_uint16(hidden_states: Any) -> np.ndarray:
    """torch bf16 (any device) / numpy bf16 / numpy uint16 -> numpy uint16 bits, zero-copy when possible."""
    # Check the type by module name so numpy-only writers never pay torch's import time.
    if type(hidden_states).__module__.startswith("torch"):
        import torch

        if hidden_states.dtype != torch.bfloat16:
            raise TypeError(
                f"hidden_states must be torch.bfloat16, got {hidden_states.dtype}; the store keeps "
                "the model's bf16 states bit-exactly and never converts."
            )
        # Each torch call drops and retakes the GIL, which the capture's many store threads contend for:
        # a CPU, contiguous tensor without grad (the capture's case) takes two.
        t = hidden_states
        if t.requires_grad:
            t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        return t.view(torch.uint16).numpy()
    a = np.asarray(hidden_states)
    if a.dtype == BF16:
        return a.view(np.uint16)
    if a.dtype == np.uint16:
        return a
    raise TypeError(f"hidden_states must be torch.bfloat16 or numpy uint16/bfloat16 bits, got {a.dtype}.")


def _nothing() -> None:
    """The release of a Loan over the writer's own memory: the garbage collector frees it."""


def _as_1d(name: str, x: Any, dtype: np.dtype) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D [T], got shape {a.shape}")
    if a.dtype != dtype:
        if a.size and (a.min() < np.iinfo(dtype).min or a.max() > np.iinfo(dtype).max):
            raise ValueError(f"{name} has values outside {dtype} ({a.min()}..{a.max()})")
        a = a.astype(dtype)
    return np.ascontiguousarray(a)


class TaskStoreWriter:
    """The single writer of one task store. See the module docstring for the commit protocol."""

    layouts: dict[str, ArrayLayout]

    def __init__(self) -> None:  # use TaskStoreWriter.open()
        raise TypeError("use TaskStoreWriter.open(path, spec, store_cfg)")

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        spec: StoreSpec,
        store_cfg: Any = None,
        *,
        threads: int | None = None,
        repair: bool = False,
        on_commit: Callable[[int, int], None] | None = None,
    ) -> "TaskStoreWriter":
        """Open (creating or recovering) the store at `path` for appending.

        `store_cfg`: a `StoreConfig` (codec, level, blocksize, chunk_tokens, shard_tokens, fsync); an
        existing store keeps its own layout and codec. `repair=True` truncates the committed record to
        the last sample before the first damaged shard instead of raising StoreCorruptError.
        `on_commit(num_samples, num_tokens)` is called with the committed record's totals once the store
        is open (what an earlier writer committed) and after every commit that added samples, from the
        thread that called open()/commit(): how a task reports progress, whatever way it appends.
        """
        from eagle_batch.config import StoreConfig

        self = object.__new__(cls)
        self.path = Path(path)
        self.spec = spec
        self.cfg = store_cfg if store_cfg is not None else StoreConfig()
        self.fsync = bool(self.cfg.fsync)
        self.adaptive = bool(self.cfg.adaptive)
        self.entropy_only = bool(self.cfg.entropy_only)
        self.trace = StoreTrace(self.cfg.trace_dir or None)
        self._closed = False
        self._broken: BaseException | None = None
        self._lock = None
        self._ingest: Ingest | None = None
        makedirs_durable(self.path, self.fsync)
        self._lock = StoreLock(self.path)
        try:
            self._open_locked(threads, repair)
        except BaseException:
            if self._ingest is not None:
                self._ingest.close()
            self._lock.release()
            raise
        self._on_commit = on_commit
        self._report_commit()
        return self

    def _open_locked(self, threads: int | None, repair: bool) -> None:
        c = self.cfg
        chunk_tokens = c.chunk_tokens or auto_chunk_tokens(hidden_row_nbytes(self.spec), c.shard_tokens)
        self.spec, self.layouts, self._progress = open_store(
            self.path, self.spec, c, chunk_tokens, fsync=self.fsync, entropy_only=self.entropy_only, repair=repair
        )
        self._ingest = Ingest(
            self.path,
            self.layouts,
            self._progress.tables,
            fsync=self.fsync,
            adaptive=self.adaptive,
            entropy_only=self.entropy_only,
            trace=self.trace,
            threads=threads or c.encode_threads or None,
            io_threads=c.io_threads or None,
        )
        for name, st in self._ingest.streams.items():  # continue the committed tail shards
            st.resume(*committed_tail(self.path, st.layout, self._progress.tables[name], self._progress.num_tokens))
        self._complete = (self.path / COMPLETE_NAME).is_file()

    def _report_commit(self) -> None:
        if self._on_commit is not None:
            self._on_commit(self._progress.num_committed, int(self._progress.record["num_tokens"]))

    # ----- state -----

    @property
    def committed_sample_ids(self) -> frozenset[str]:
        """Ids of the samples in the committed record (what survives a crash)."""
        return self._progress.committed_ids

    @property
    def record(self) -> dict:
        """The committed record as last written (progress.json)."""
        return self._progress.record

    @property
    def num_committed(self) -> int:
        return self._progress.num_committed

    @property
    def num_appended(self) -> int:
        return len(self._progress.sample_ids)

    @property
    def num_tokens(self) -> int:
        return self._progress.num_tokens

    @property
    def is_complete(self) -> bool:
        return self._complete

    @property
    def encode_threads(self) -> int:
        return self._ingest.encode_threads

    @property
    def io_threads(self) -> int:
        return self._ingest.io_threads

    @property
    def stall_s(self) -> dict[str, float]:
        """Seconds append() waited: for a compression slot ("encode") and for shard writes ("io")."""
        return self._ingest.stall_s

    def encoder_info(self) -> dict:
        """How hidden_states chunks are compressed: eagle-batch's entropy-only frames, c-blosc/zstd called
        into our buffers (`direct`), or numcodecs' own encode; and why a faster path is not in use."""
        e = self._ingest.streams["hidden_states"].encoder
        return {
            "entropy_only": e.entropy_only,
            "direct": e.direct,
            "why_not_entropy_only": e.why_not_entropy or None,
            "why_not_direct": e.why_not_direct or None,
        }

    def chunk_stats(self) -> dict[str, int]:
        """hidden_states inner chunks compressed vs kept raw by `store.adaptive` since open()."""
        st = self._ingest.streams["hidden_states"]
        return {"compressed": st.chunks_compressed, "stored_raw": st.chunks_raw}

    # ----- appending -----

    def append(
        self,
        sample_id: str,
        input_ids: Any,
        loss_mask: Any,
        hidden_states: Any,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        """Queue one sample; durable only after the next commit(). `hidden_states`: bf16 [T, L, H] (torch, or
        numpy uint16 bits); a float8 store (spec.dtype float8_e4m3 or float8_e5m2) quantizes it, or takes `Fp8Rows` (codes and
        scales) quantized by the caller (store/fp8.py has the one definition).

        Without `on_release` the rows are copied before append returns. With it, `hidden_states` is lent:
        the writer may read it in place from its compression threads after append returned, and calls
        `on_release()` exactly once (from any thread; also when append raises) when it no longer reads
        it. The caller must not modify or reuse that memory before.
        """
        self.append_block([sample_id], [input_ids], [loss_mask], hidden_states, on_release)

    def append_block(
        self,
        sample_ids: list,
        input_ids: list,
        loss_masks: list,
        hidden_states: Any,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        """Queue consecutive samples whose hidden states lie back to back in one `[sum T, L, H]` block (as
        the capture receives an engine step's finished requests); like `append` for each, lending the block
        as a whole with `on_release`. Every sample is checked before any is queued: either all or none.

        Chunks are compressed in place wherever they lie inside the block, also across sample boundaries:
        only the block's first and last partial chunks are copied, where per-sample appends of varied
        lengths copy about one chunk per sample."""
        loan = Loan(on_release) if on_release is not None else None
        t0 = self.trace.stamp()
        try:
            self._append_block(sample_ids, input_ids, loss_masks, hidden_states, loan)
        finally:
            if loan is not None:
                loan.drop()  # append's own hold: the compression jobs hold the rows from here on
            self.trace.event("append", t0, sample=str(sample_ids[0]) if sample_ids else "", samples=len(sample_ids))

    def _append_block(
        self, sample_ids: list, input_ids: list, loss_masks: list, hidden_states: Any, loan: Loan | None
    ) -> None:
        self._check_open()
        if self._complete:
            raise StoreError(f"{self.path} is finalized (complete marker present); it takes no more samples.")
        sids, ids, masks, hs = self._checked_block(sample_ids, input_ids, loss_masks, hidden_states)
        streams = self._ingest.streams
        streams["input_ids"].push(ids[0] if len(ids) == 1 else np.concatenate(ids))
        streams["loss_mask"].push(masks[0] if len(masks) == 1 else np.concatenate(masks))
        if isinstance(hs, Fp8Rows):
            streams[SCALE_ARRAY].push(hs.scales)
            if hs is not hidden_states:  # quantized here: our own codes, compressed in place like lent rows
                own = Loan(_nothing)
                streams["hidden_states"].push(hs.codes, own)
                own.drop()
            elif hs.codes.flags.c_contiguous:
                streams["hidden_states"].push(hs.codes, loan)
            else:  # copied into the stream's chunk buffers; the lender's memory is free on return
                streams["hidden_states"].push(hs.codes)
        else:
            streams["hidden_states"].push(np.ascontiguousarray(hs), loan)
        self._progress.add(sids, ids)

    def _checked_block(self, sample_ids: list, input_ids: list, loss_masks: list, hidden_states: Any) -> tuple:
        """(sample ids, token ids, masks, hidden states as stored) of a block, or ValueError/TypeError naming the
        first sample that is wrong (a duplicate, no tokens, shapes that disagree)."""
        if not (len(sample_ids) == len(input_ids) == len(loss_masks)) or not sample_ids:
            raise ValueError(
                f"append_block: {len(sample_ids)} sample ids, {len(input_ids)} input_ids, "
                f"{len(loss_masks)} loss masks; give one of each per sample (at least one)"
            )
        hs = hidden_states if isinstance(hidden_states, Fp8Rows) else hidden_states_to_uint16(hidden_states)
        sids = [str(x) for x in sample_ids]
        ids = [_as_1d("input_ids", x, np.dtype(np.int32)) for x in input_ids]
        masks = [_as_1d("loss_mask", x, np.dtype(np.uint8)) for x in loss_masks]
        row = (self.spec.num_layers, self.spec.hidden_size)
        total = 0
        for sid, i, m in zip(sids, ids, masks):
            if sid in self._progress.id_set:
                raise ValueError(
                    f"sample_id {sid!r} is already in {self.path}; skip samples in "
                    "writer.committed_sample_ids before running them."
                )
            if len(sids) > 1 and sids.count(sid) > 1:
                raise ValueError(f"sample_id {sid!r} appears more than once in one append_block call")
            if len(i) == 0:
                raise ValueError(f"sample {sid!r} has no tokens")
            if len(m) != len(i):
                raise ValueError(
                    f"sample {sid!r}: shapes disagree: input_ids {i.shape}, loss_mask {m.shape}; "
                    "expected one mask entry per token."
                )
            total += len(i)
        if hs.shape != (total, *row):
            what = f"sample {sids[0]!r}" if len(sids) == 1 else f"samples {sids[0]!r}..{sids[-1]!r}"
            raise ValueError(
                f"{what}: shapes disagree: input_ids [{total}] tokens, hidden_states {hs.shape}; "
                f"expected {[total, *row]} (layer_ids={self.spec.layer_ids}, "
                f"hidden_size={self.spec.hidden_size})."
            )
        return sids, ids, masks, self._stored_rows(hs, sids)

    def _stored_rows(self, hs: np.ndarray | Fp8Rows, sample_ids: list) -> np.ndarray | Fp8Rows:
        """The states as this store keeps them: bf16 bits, or (a float8 store.dtype) codes and row scales,
        quantized here from bf16 bits unless the caller did (the capture, on the device)."""
        fp8 = self.spec.dtype != "bfloat16"
        if isinstance(hs, Fp8Rows):
            if not fp8:
                raise TypeError(
                    f"{self.path} stores bfloat16 hidden states (store.dtype) but was given float8 codes; "
                    "append the bf16 states, or write to a store created with a float8 store.dtype."
                )
            rows = hs
        elif not fp8:
            return hs
        else:
            rows = quantize(np.ascontiguousarray(hs), float8(self.spec.dtype))
        if not np.isfinite(rows.scales).all():
            what = (
                f"sample {sample_ids[0]!r}"
                if len(sample_ids) == 1
                else f"samples {sample_ids[0]!r}..{sample_ids[-1]!r}"
            )
            raise ValueError(
                f"{what}: hidden states hold NaN/Inf, which float8 (store.dtype={self.spec.dtype}) cannot store; "
                "check the model dtype, or capture into a bfloat16 store to keep them as they are."
            )
        return rows

    # ----- commit, finalize, close -----

    def commit(self) -> None:
        """Durability barrier: on return every appended sample is on disk and in the committed record."""
        self._check_open()
        if not self._progress.has_uncommitted:
            return
        t0 = self.trace.stamp()
        try:
            self._ingest.write_tails_and_wait()  # every shard the record will name is on disk, synced
            self._progress.write(self.path, self.fsync)  # the commit point
            write_shapes(self.path, self.layouts, self._progress.num_tokens, self.fsync)  # after the record
            self.trace.event("commit", t0, samples=len(self._progress.sample_ids))
        except BaseException as e:
            self._broken = e
            raise
        self._report_commit()

    def finalize(self) -> None:
        """Commit, then write offsets, sample_ids, consolidated metadata and (last) the `complete` marker."""
        self._check_open()
        self.commit()
        if self._complete:
            return
        p = self._progress
        finalize_store(self.path, p.sample_ids, p.lengths, p.record["commit"], self.fsync)
        self._complete = True

    def close(self) -> None:
        """Stop background threads and release the lock. Uncommitted samples are dropped (commit first)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._ingest is not None:
                self._ingest.close()
        finally:
            self.trace.dump()
            if self._lock is not None:
                self._lock.release()

    def _check_open(self) -> None:
        broken = self._broken or self._ingest.failed
        if broken is not None:
            raise StoreError(
                f"an earlier commit of {self.path} failed ({broken!r}); close this writer and "
                "reopen the store, which recovers the last committed record."
            )
        if self._closed:
            raise StoreError(f"the writer of {self.path} is closed; open a new one with TaskStoreWriter.open().")

    def __enter__(self) -> "TaskStoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort if a caller forgets close()
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

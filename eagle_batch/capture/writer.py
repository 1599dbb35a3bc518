"""The one thread that checks captured states and feeds the task's store writer.

Every backend hands finished samples to `WriterThread.put` (the native connector does so from the
engine thread, in the middle of a vLLM step), so `put` only enqueues. The thread then, in order:
waits for the sample's device-to-host copy, runs the write-time checks, converts to bf16 (or, rows the
connector quantized for a float8 store, views them as codes and scales: capture/fp8.py) and calls
`writer.append`, lending it the states: the store compresses them in place on its own threads and
hands them back (the shared-memory ring slot, the back-pressure budget) once encoded, so this thread
only does bookkeeping. `commit()` requests are queued behind the appends that precede them, so compression
and commits overlap the next batch's compute instead of stalling it. The queue is bounded in bytes:
when the store cannot keep up, `put` blocks (back-pressure) rather than exhausting host memory.

A failed check stops all further appends (nothing after the bad sample is committed) and the error,
naming the sample id, is raised in the driver thread at its next call (`raise_if_failed`, `commit`,
`close`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from eagle_batch.store.loan import Loan
from eagle_batch.store.protocol import StoreWriterProtocol

from .fp8 import unpack
from .sink import CapturedRequest, Sink

log = logging.getLogger(__name__)


class CaptureError(RuntimeError):
    """A write-time check failed; the message names the sample id, the field and what to do."""


@dataclass
class WriterStats:
    samples: int = 0
    tokens: int = 0
    bytes_raw: int = 0
    commits: int = 0
    write_s: float = 0.0  # writer thread busy appending (checks, hand-over to the store)
    commit_s: float = 0.0
    put_wait_s: float = 0.0  # time put() blocked on back-pressure (the engine thread or the shm receiver)


def check_captured(
    sample_id: str,
    expected_ids: np.ndarray,
    echoed_ids: np.ndarray | None,
    states: torch.Tensor | np.ndarray,  # a tensor where check_finite scans it
    num_layers: int,
    hidden_size: int,
    check_finite: bool,
) -> None:
    """Write-time checks; raise CaptureError naming the sample and the failed field."""
    T = int(len(expected_ids))
    if echoed_ids is not None:
        echoed = np.asarray(echoed_ids).reshape(-1)
        if len(echoed) != T or not np.array_equal(echoed.astype(np.int64), np.asarray(expected_ids, dtype=np.int64)):
            first = next(
                (i for i in range(min(len(echoed), T)) if int(echoed[i]) != int(expected_ids[i])), min(len(echoed), T)
            )
            raise CaptureError(
                f"sample {sample_id}: token-id echo mismatch (engine saw {len(echoed)} tokens, sample has {T}; "
                f"first difference at position {first}). The request/sample mapping or the prompt was "
                "altered (prefix caching must be off, prompts must be passed as token ids)."
            )
    shape = tuple(states.shape)
    if shape != (T, num_layers, hidden_size):
        raise CaptureError(
            f"sample {sample_id}: hidden_states shape {shape}, expected ({T}, {num_layers}, "
            f"{hidden_size}) = (tokens, layers, hidden). Check model.layer_ids and the backend."
        )
    if check_finite and not bool(torch.isfinite(states).all()):
        bad = (~torch.isfinite(states)).nonzero()
        t, l = int(bad[0, 0]), int(bad[0, 1])
        raise CaptureError(
            f"sample {sample_id}: hidden_states contain NaN/Inf ({len(bad)} values; first at "
            f"token {t}, layer index {l}). Check the model dtype (fp16 overflows) or weights; "
            "set extract.check_finite=false only to debug."
        )


def _hand_back(release: Callable[[], None] | None, unbudget: Callable[[int], None], nbytes: int) -> None:
    """A captured request's memory back: its ring slot (`release`) and its bytes of the back-pressure budget.
    Called through a Loan, so exactly once."""
    if release is not None:
        release()
    unbudget(nbytes)


class WriterThread(Sink):
    def __init__(
        self,
        writer: StoreWriterProtocol,
        num_layers: int,
        hidden_size: int,
        check_finite: bool = True,
        max_pending_bytes: int = 4 << 30,
    ):
        self.writer = writer
        self.num_layers = num_layers
        self.hidden_size = hidden_size
        self.check_finite = check_finite
        self.max_pending_bytes = max_pending_bytes
        self.stats = WriterStats()
        self._q: queue.Queue = queue.Queue()
        self._cv = threading.Condition()
        self._pending_bytes = 0
        self._expected: dict[str, Any] = {}  # sample_id -> Sample, not yet received
        self._received: set[str] = set()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="eagle-batch-writer", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- driver side
    def expect(self, samples: Sequence[Any]) -> None:
        """Announce a batch. Queued like everything else, so a commit checks exactly the batches before it."""
        self._q.put(("expect", list(samples), 0))

    def put(self, item: CapturedRequest) -> None:
        nbytes = int(item.states.numel() * item.states.element_size())
        with self._cv:
            t0 = None
            while (
                self._pending_bytes > 0
                and self._pending_bytes + nbytes > self.max_pending_bytes
                and self._error is None
            ):
                t0 = t0 or time.perf_counter()
                self._cv.wait(0.5)
            if t0 is not None:
                self.stats.put_wait_s += time.perf_counter() - t0
            self._pending_bytes += nbytes
        self._q.put(("append", item, nbytes))

    def commit(self, wait: bool = False) -> None:
        ev = threading.Event()
        self._q.put(("commit", ev, 0))
        if wait:
            self._wait(ev)

    def flush(self) -> None:
        ev = threading.Event()
        self._q.put(("flush", ev, 0))
        self._wait(ev)

    def _wait(self, ev: threading.Event) -> None:
        while not ev.wait(0.2):
            if self._error is not None or not self._thread.is_alive():
                break
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def missing(self) -> list[str]:
        with self._cv:
            return sorted(self._expected)

    def close(self) -> None:
        self._q.put(("stop", None, 0))
        self._thread.join()
        self.raise_if_failed()

    # ----------------------------------------------------------------- writer thread
    def _run(self) -> None:
        ahead = None  # an op taken from the queue while collecting appends, handled next
        while True:
            op, arg, nbytes = ahead if ahead is not None else self._q.get()
            ahead = None
            if op == "stop":
                return
            if self._error is not None:  # drop everything after a failure; release waiters
                if op in ("commit", "flush"):
                    arg.set()
                elif op == "append" and arg.release is not None:
                    arg.release()
                self._release(nbytes)
                continue
            try:
                if op == "expect":
                    with self._cv:
                        for smp in arg:
                            self._expected[smp.sample_id] = smp
                elif op == "append":
                    # Every append already queued goes in one pass: consecutive requests of one transport
                    # record then reach the store as one block.
                    items = [(arg, Loan(_hand_back, arg.release, self._release, nbytes))]
                    nbytes = 0  # now released by each item's `done`: when the store no longer reads its states
                    while ahead is None:
                        try:
                            nxt = self._q.get_nowait()
                        except queue.Empty:
                            break
                        if nxt[0] == "append":
                            items.append((nxt[1], Loan(_hand_back, nxt[1].release, self._release, nxt[2])))
                        else:
                            ahead = nxt
                    try:
                        self._append(items)
                    except BaseException:
                        for _, done in items:
                            done()
                        raise
                elif op == "commit":
                    missing = self.missing()
                    if missing:
                        raise CaptureError(
                            f"{len(missing)} samples handed to the engine never came back "
                            f"(first: {missing[:5]}); the engine dropped or aborted them."
                        )
                    t0 = time.perf_counter()
                    self.writer.commit()
                    self.stats.commit_s += time.perf_counter() - t0
                    self.stats.commits += 1
                    arg.set()
                elif op == "flush":
                    arg.set()
            except BaseException as e:  # noqa: BLE001 - surfaced in the driver thread
                self._error = e
                log.error("capture writer failed: %s", e)
                if op in ("commit", "flush"):
                    arg.set()
            finally:
                self._release(nbytes)

    def _release(self, nbytes: int) -> None:
        if nbytes:
            with self._cv:
                self._pending_bytes -= nbytes
                self._cv.notify_all()

    def _checked(self, item: CapturedRequest):
        """(sample, states as given to the store: bf16, or float8 codes and scales) after the write-time checks."""
        with self._cv:
            sample = self._expected.pop(item.sample_id, None)
        if sample is None:
            what = "twice" if item.sample_id in self._received else "but was never submitted"
            raise CaptureError(f"sample {item.sample_id}: the engine returned it {what} (request {item.req_id}).")
        self._received.add(item.sample_id)
        if item.ready is not None:
            item.ready()  # CUDA: the async device-to-host copy has landed
        states = item.states
        ids = np.asarray(sample.input_ids)
        # A finite flag computed on the device saves a full CPU scan; if it says "bad", scan for details.
        f = item.finite
        scan = self.check_finite and (f is None or not (f if isinstance(f, bool) else bool(f.all())))
        if states.dtype == torch.uint8:  # float8 codes and row scales, quantized on the device
            return sample, self._fp8_rows(item, ids, scan)
        check_captured(item.sample_id, ids, item.token_ids, states, self.num_layers, self.hidden_size, scan)
        if item.bits is not None and states.dtype == torch.bfloat16:
            hs = item.bits  # the same bytes, no torch call on this thread (see CapturedRequest.bits)
        else:
            hs = states if states.dtype == torch.bfloat16 else states.to(torch.bfloat16)
        return sample, hs

    def _fp8_rows(self, item: CapturedRequest, ids: np.ndarray, scan: bool):
        try:
            rows = unpack(item.states.numpy(), self.num_layers, self.hidden_size)
        except ValueError as e:
            raise CaptureError(f"sample {item.sample_id}: {e}. Check model.layer_ids and the backend.") from None
        check_captured(item.sample_id, ids, item.token_ids, rows.codes, self.num_layers, self.hidden_size, False)
        # A NaN/Inf state makes its row's scale non-finite (the maximum propagates it).
        if scan and not np.isfinite(rows.scales).all():
            t, l = (int(x[0]) for x in np.nonzero(~np.isfinite(rows.scales)))
            raise CaptureError(
                f"sample {item.sample_id}: hidden_states contain NaN/Inf (first at token {t}, layer index {l}), "
                "which a float8 store cannot hold. Check the model dtype (fp16 overflows) or weights."
            )
        return rows

    def _append(self, items: list[tuple[CapturedRequest, Callable[[], None]]]) -> None:
        """Check every item, then hand them to the store: runs of consecutive rows of one record as one block."""
        t0 = time.perf_counter()
        checked, failed = [], None
        for item, done in items:
            try:
                checked.append((item, done, *self._checked(item)))
            except CaptureError as e:  # the samples before the bad one still go to the store, none after it
                failed = e
                break
        i = 0
        while i < len(checked):
            item, _, _, hs = checked[i]
            j, end = i + 1, item.row0 + len(hs)
            while (
                item.block is not None
                and j < len(checked)
                and checked[j][0].block is item.block
                and checked[j][0].row0 == end
            ):
                end += len(checked[j][3])
                j += 1
            run = checked[i:j]
            samples = [c[2] for c in run]
            ids = [np.asarray(s.input_ids) for s in samples]
            masks = [np.asarray(s.loss_mask) for s in samples]
            if len(run) == 1:
                self.writer.append(samples[0].sample_id, ids[0], masks[0], hs, on_release=run[0][1])
            else:
                dones = [c[1] for c in run]
                self.writer.append_block(
                    [s.sample_id for s in samples],
                    ids,
                    masks,
                    item.block[item.row0 : end],
                    on_release=lambda dones=dones: [d() for d in dones],
                )
            for s, (_, _, _, h) in zip(samples, run):
                self.stats.samples += 1
                self.stats.tokens += int(len(s.input_ids))
                self.stats.bytes_raw += int(h.nbytes)
            i = j
        self.stats.write_s += time.perf_counter() - t0
        if failed is not None:
            raise failed

"""Where the worker-side connector hands finished requests: a `Sink` found by key.

The connector runs inside the vLLM worker. When that worker lives in our own process (TP=1 with the
engine in-process: `extract.engine_process`, the default on CPU), it looks the sink up in this
process-global registry by the key it got in `kv_connector_extra_config["eb_sink"]` and hands each
request's states over without any copy or serialization. When the worker is another process (TP>1, or
TP=1 with vLLM's background engine process, the default on CUDA), the key is not registered there and
the connector uses the shared-memory transport (`eagle_batch.capture.shm`), whose receiving end in our
process feeds the same kind of Sink.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch


@dataclass
class CapturedRequest:
    """One finished request as the connector saw it."""

    sample_id: str
    req_id: str
    token_ids: np.ndarray  # the prompt ids vLLM actually processed (echo check)
    states: Any  # torch [T, L, H] (pinned CPU on CUDA, plain CPU tensor on CPU)
    ready: Callable[[], None] | None = None  # blocks until `states` is valid (CUDA event sync)
    finite: Any = None  # optional: bool, or bool tensor (one flag per row, or [1]) from the device, valid after ready()
    release: Callable[[], None] | None = None  # called once `states` is no longer needed (shared ring)
    # Optional: `states`' bf16 bits as a numpy uint16 array over the same memory (the shared-ring receiver
    # has it for free). The writer thread appends it instead of `states`: every torch call drops and retakes
    # the GIL, and retaking it waits behind the capture process's busy threads (docs/decisions/0018).
    bits: np.ndarray | None = None
    # Optional: the rows of the transport record (one engine step's requests, back to back) that `states` is
    # rows [row0, row0 + T) of, as bf16 (torch) or its uint16 bits (numpy). Consecutive requests of one
    # block go to the store as one lent block: chunks are then compressed in place across sample boundaries.
    block: Any = None
    row0: int = 0


class Sink:
    """Receives CapturedRequests from a connector; `put` must be cheap (it runs on the engine thread).

    A sink owns each item it was given: it must call `item.release()` (when set) exactly when it no
    longer reads `item.states`, also for items it drops. The shared-memory ring frees space only past
    released records, so one item never released stops the producer once the ring is full."""

    def put(self, item: CapturedRequest) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class CollectingSink(Sink):
    """Keeps every captured request by sample id, for validation and benchmarks rather than the store: a
    shared-ring item's states are copied out and its slot released at once, so a long run never stalls
    the producer (`put` runs on the engine thread: the copy is the price of keeping everything)."""

    def __init__(self) -> None:
        self.items: dict[str, CapturedRequest] = {}

    def put(self, item: CapturedRequest) -> None:
        if item.ready is not None:
            item.ready()
        if item.release is not None:
            item.states, release = item.states.clone(), item.release
            item.release = None
            release()
        self.items[item.sample_id] = item


# One finished request of a step record: (sample id, vLLM request id, prompt token ids, rows).
RequestRows = tuple[str, str, Sequence[int], int]


class StepTransport(Protocol):
    """How the connector (in a vLLM worker) hands one engine step's rows to the capture process.

    `alloc_host` gives the host tensor the connector copies a step's rows into (`where` locates it for the
    transport); `put_rows` hands over the requests whose rows lie back to back in it, `ready()` blocking
    until the copy is done; records are at most `max_record_bytes` (None: any size). Implementations:
    `InProcessTransport` (the sink is in the worker's process) and `shm.ShmProducer` (shared ring)."""

    @property
    def max_record_bytes(self) -> int | None: ...

    def alloc_host(self, shape: Sequence[int], dtype: torch.dtype, pin: bool) -> tuple[torch.Tensor, Any]: ...

    def put_rows(
        self,
        requests: list[RequestRows],
        rows: torch.Tensor,
        where: Any,
        ready: Callable[[], None] | None = None,
        finite_rows: torch.Tensor | None = None,
    ) -> None: ...

    def close(self) -> None: ...


class InProcessTransport:
    """The worker runs in the capture process (TP=1, engine in-process): each request goes to the sink as a
    CapturedRequest viewing its rows of the step's host block; nothing is copied again or serialized."""

    max_record_bytes = None

    def __init__(self, sink: Sink):
        self.sink = sink

    def alloc_host(self, shape: Sequence[int], dtype: torch.dtype, pin: bool) -> tuple[torch.Tensor, Any]:
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=pin), None

    def put_rows(
        self,
        requests: list[RequestRows],
        rows: torch.Tensor,
        where: Any,
        ready: Callable[[], None] | None = None,
        finite_rows: torch.Tensor | None = None,
    ) -> None:
        block = rows if rows.dtype == torch.bfloat16 else None
        off = 0
        for sample_id, req_id, token_ids, n in requests:
            finite = None if finite_rows is None else finite_rows[off : off + n]
            ids = np.asarray(token_ids, dtype=np.int64)
            self.sink.put(
                CapturedRequest(sample_id, req_id, ids, rows[off : off + n], ready, finite, block=block, row0=off)
            )
            off += n

    def close(self) -> None:
        return None


# key -> (pid that registered it, sink). vLLM constructs the connector itself from a config dict, so an
# in-process worker can only find the capture's sink by a key: this registry is the one piece of module
# state capture keeps. A forked worker inherits a copy of this dict: the pid check keeps it from feeding a
# copy of the sink that nobody reads (it must use the shared-memory transport).
_REGISTRY: dict[str, tuple[int, Sink]] = {}
_LOCK = threading.Lock()


def register(sink: Sink) -> str:
    key = uuid.uuid4().hex
    with _LOCK:
        _REGISTRY[key] = (os.getpid(), sink)
    return key


def unregister(key: str) -> None:
    with _LOCK:
        _REGISTRY.pop(key, None)


def lookup(key: str) -> Sink | None:
    with _LOCK:
        got = _REGISTRY.get(key)
    return got[1] if got is not None and got[0] == os.getpid() else None

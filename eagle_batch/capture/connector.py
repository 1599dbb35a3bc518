"""`EagleBatchConnector`: a vLLM KV connector that hands each finished prompt's hidden states to us.

Loaded by vLLM through `kv_connector_module_path="eagle_batch.capture.connector"` together with the
`extract_hidden_states` speculative method, whose dummy draft model writes the aux hidden states of
every scheduled token into a cache-only attention layer (one "KV-cache" slot per token holding
`[L, H]`). This connector only reads that cache; it never monkey-patches vLLM.

Flow (requests are prompts with max_tokens=1, so a request finishes in the step that computes its last
prompt token):

1. Scheduler side, `build_connector_meta(step k)`: track every scheduled request's blocks of the
   hidden-state KV-cache group and computed-token count; a request whose prompt completes in step k gets
   an `ExtractItem` (request id, sample id from `kv_transfer_params["eb_sample_id"]`, block ids,
   prompt token ids) in step k's metadata.
2. Worker side, `wait_for_save(step k)`: vLLM calls it after the target AND the draft model ran
   (deferred finalization), so the states of step k are in the cache. TP rank 0 gathers the items'
   `[T, L, H]` rows from the cache, all of the step's items in one indexing op: on CUDA on a side stream
   into pinned host memory (non-blocking, an event marks completion; the default stream never waits),
   on CPU as a plain copy. For a float8 store (`eb_store_dtype`) the rows are quantized on the device
   first (`capture/fp8.py`), so the copy moves codes and row scales: half the bytes. The items go to the
   Sink (a queue: nothing is written on the engine thread).
   Other TP ranks do nothing (their states are identical replicas).
3. Scheduler side, `request_finished`: returns True (keep the blocks) for extracted requests, so the
   cache rows cannot be overwritten before the copy is done; the worker reports them in
   `get_finished` once their copy event completed (every rank reports, so vLLM's default aggregation
   over all ranks works on every version).

Because items are handed over in step k, before the step's outputs reach the client, every request
that `LLM.generate` returned is already in the Sink: no extra engine step, no lock file, no file per
request. Where the Sink lives is decided in `register_kv_caches`, which picks the step transport
(`sink.StepTransport`): the in-process sink from the registry, or the shared-memory ring to the driver
process (`eagle_batch.capture.shm`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

try:  # hybrid memory allocator support (the hidden-state cache is a group of its own)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:  # pragma: no cover - older vLLM

    class SupportsHMA:  # type: ignore[no-redef]
        pass


from eagle_batch.store.fp8 import float8

from . import fp8
from . import sink as sink_registry
from . import vllm_compat as compat

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

log = logging.getLogger(__name__)

SAMPLE_KEY = "eb_sample_id"


@dataclass
class ExtractItem:
    req_id: str
    sample_id: str
    block_ids: list[int]
    num_tokens: int
    token_ids: list[int]


@dataclass
class EagleBatchConnectorMetadata(KVConnectorMetadata):
    items: list[ExtractItem] = field(default_factory=list)


@dataclass
class _ReqState:
    sample_id: str
    prompt_ids: list[int]
    blocks: list[int]
    sent: bool = False


class EagleBatchConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        try:
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        except TypeError:  # vLLM without kv_cache_config in the base constructor
            super().__init__(vllm_config=vllm_config, role=role)
        if vllm_config.speculative_config is None:
            raise RuntimeError("EagleBatchConnector needs speculative_config method=extract_hidden_states")
        hf = vllm_config.speculative_config.draft_model_config.hf_config
        self.layer_ids = list(getattr(hf, "eagle_aux_hidden_state_layer_ids", []) or [])
        self._gid = compat.hidden_state_group_id(kv_cache_config)
        self._block_size = compat.group_block_size(vllm_config, kv_cache_config, self._gid)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._sink_key = extra.get("eb_sink")
        self._shm_spec = extra.get("eb_shm")
        dtype = extra.get("eb_store_dtype", "bfloat16")
        self._fp8 = float8(dtype) if dtype != "bfloat16" else None  # quantize before the copy
        # scheduler side
        self._reqs: dict[str, _ReqState] = {}
        # worker side
        self._kv: torch.Tensor | None = None
        self._layout = "LBH"  # [blocks, L, block_size, H]; "BLH" = [blocks, block_size, L, H]
        self._rank0 = True
        self._transport: sink_registry.StepTransport | None = None
        self._stream = None
        self._inflight: dict[str, Any] = {}  # req_id -> cuda event (or None when nothing to wait for)
        self._finished: set[str] = set()

    # ------------------------------------------------------------------ scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False  # store-only

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        return None

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = EagleBatchConnectorMetadata()
        for s in compat.iter_scheduled(scheduler_output):
            st = self._reqs.get(s.req_id)
            if s.is_new or st is None:
                params = compat.extra_args_of(s.sampling_params).get("kv_transfer_params") or {}
                prompt = list(s.prompt_token_ids or [])
                st = _ReqState(sample_id=str(params.get(SAMPLE_KEY, s.req_id)), prompt_ids=prompt, blocks=[])
                self._reqs[s.req_id] = st
            if s.block_ids is not None:
                new = list(s.block_ids[self._gid]) if self._gid < len(s.block_ids) else []
                st.blocks = new if (s.resumed or s.is_new) else st.blocks + new
            if not st.sent and st.prompt_ids and s.num_computed_tokens + s.num_scheduled_tokens >= len(st.prompt_ids):
                n = len(st.prompt_ids)
                need = -(-n // self._block_size)
                if len(st.blocks) < need:
                    raise RuntimeError(
                        f"sample {st.sample_id}: request {s.req_id} has {len(st.blocks)} "
                        f"hidden-state blocks for {n} tokens (needs {need}); vLLM "
                        f"{compat.vllm_version()} scheduler output not understood"
                    )
                meta.items.append(ExtractItem(s.req_id, st.sample_id, st.blocks[:need], n, st.prompt_ids))
                st.sent = True
        return meta

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.pop(request.request_id, None)
        # Keep the blocks until the worker's copy is done (reported by get_finished).
        return (bool(st and st.sent), None)

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, None)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> str | None:
        # Same as vLLM's hidden-state connector: keep each token's [L, H] rows contiguous.
        return compat.token_major_kv_layout()

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self._rank0 = compat.tp_rank() == 0
        names = compat.cache_only_layer_names(self._vllm_config, list(kv_caches.keys()))
        if len(names) != 1:
            raise RuntimeError(f"expected one cache-only hidden-state layer, found {names}")
        kv = kv_caches[names[0]]
        L = len(self.layer_ids)
        if kv.dim() != 4:
            raise RuntimeError(f"hidden-state cache has shape {tuple(kv.shape)}; expected 4 dims")
        if kv.shape[1] == L and kv.shape[2] == self._block_size:
            self._layout = "LBH"
        elif kv.shape[1] == self._block_size and kv.shape[2] == L:
            self._layout = "BLH"
        else:
            raise RuntimeError(
                f"hidden-state cache shape {tuple(kv.shape)} does not match {L} layers and "
                f"block size {self._block_size} (vLLM {compat.vllm_version()})"
            )
        self._kv = kv
        if not self._rank0:
            return
        sink = sink_registry.lookup(self._sink_key) if self._sink_key else None
        if sink is not None:
            self._transport = sink_registry.InProcessTransport(sink)
        elif self._shm_spec:
            from .shm import ShmProducer

            self._transport = ShmProducer(self._shm_spec)
        else:
            raise RuntimeError(
                "EagleBatchConnector: no sink in this process and no shared-memory transport configured "
                "(start the engine through eagle_batch.capture.native.NativeBackend)"
            )
        if kv.is_cuda:
            self._stream = torch.cuda.Stream(device=kv.device)

    def start_load_kv(self, *args, **kwargs) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        return None  # states are read once per request in wait_for_save

    def _gather(self, items: list[ExtractItem]) -> torch.Tensor:
        """The items' `[T, L, H]` rows back to back, `[sum T, L, H]`, with one indexing op for all of them."""
        kv = self._kv
        bs = self._block_size
        # Cache slot of every token: block ids[pos // block size], offset pos % block size.
        blk = np.concatenate([np.asarray(it.block_ids, dtype=np.int64)[np.arange(it.num_tokens) // bs] for it in items])
        off = np.concatenate([np.arange(it.num_tokens, dtype=np.int64) % bs for it in items])
        if kv.is_cuda:
            # The indices cross to the device from pinned memory: a copy from pageable memory would
            # synchronise the side stream, which waits for this step's compute, i.e. block the engine thread.
            idx = torch.empty((2, len(blk)), dtype=torch.long, pin_memory=True)
            idx.numpy()[0], idx.numpy()[1] = blk, off
            idx = idx.to(kv.device, non_blocking=True)
            b, o = idx[0], idx[1]
        else:
            b, o = torch.from_numpy(blk), torch.from_numpy(off)
        return kv[b, :, o] if self._layout == "LBH" else kv[b, o]

    def _groups(self, items: list[ExtractItem]) -> list[list[ExtractItem]]:
        """A step's items in runs of at most the transport's record size (all of them in-process)."""
        cap = self._transport.max_record_bytes
        if cap is None:
            return [items]
        L, H = len(self.layer_ids), int(self._kv.shape[-1])
        row = fp8.packed_row_nbytes(L, H) if self._fp8 is not None else L * H * self._kv.element_size()
        groups: list[list[ExtractItem]] = []
        size = 0
        for it in items:
            n = it.num_tokens * row
            if not groups or size + n > cap:
                groups.append([])
                size = 0
            groups[-1].append(it)
            size += n
        return groups

    def wait_for_save(self):
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, EagleBatchConnectorMetadata) or not meta.items:
            return
        if not self._rank0:
            for it in meta.items:
                self._inflight[it.req_id] = None
            return
        # Every request this step finished in one go: one gather, one device-to-host copy, one event and one
        # transport record per group, not per request (each costs the engine thread launches and Python).
        for group in self._groups(meta.items):
            self._save_group(group)

    def _save_group(self, items: list[ExtractItem]) -> None:
        kv, transport = self._kv, self._transport
        done = finite = None
        if kv.is_cuda:
            ready = torch.cuda.Event()
            ready.record()  # after this step's draft forward wrote the cache
            self._stream.wait_event(ready)
            with torch.cuda.stream(self._stream):
                rows = self._gather(items)
                out = fp8.pack(rows, self._fp8) if self._fp8 is not None else rows
                # Straight into the transport's pinned host memory (the shared ring across processes).
                host, where = transport.alloc_host(out.shape, out.dtype, pin=True)
                host.copy_(out, non_blocking=True)
                # NaN/Inf check on the device, one flag per token: the writer reads flags instead of scanning.
                finite = torch.empty(len(rows), dtype=torch.bool, pin_memory=True)
                finite.copy_(torch.isfinite(rows).flatten(1).all(1), non_blocking=True)
                done = torch.cuda.Event()
                done.record(self._stream)
        else:
            rows = self._gather(items)  # advanced indexing copies: safe after the blocks are reused
            out = fp8.pack(rows, self._fp8) if self._fp8 is not None else rows
            host, where = transport.alloc_host(out.shape, out.dtype, pin=False)
            host.copy_(out)
        for it in items:
            self._inflight[it.req_id] = done
        wait = None if done is None else done.synchronize
        requests = [(it.sample_id, it.req_id, it.token_ids, it.num_tokens) for it in items]
        transport.put_rows(requests, host, where, wait, finite)

    def get_finished(self, finished_req_ids: set[str]):
        self._finished.update(finished_req_ids)
        done = set()
        for rid in list(self._finished):
            if rid not in self._inflight:
                # Not extracted by us (aborted before its prompt completed): vLLM freed it already.
                self._finished.discard(rid)
                continue
            ev = self._inflight[rid]
            if ev is not None and not ev.query():
                continue
            del self._inflight[rid]
            self._finished.discard(rid)
            done.add(rid)
        return (done or None), None

    def shutdown(self):
        if self._transport is not None:
            self._transport.close()

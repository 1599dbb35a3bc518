"""Fallback backend `hooks`: forward hooks on vLLM's decoder layers, installed by a worker extension.

For models or vLLM versions where the native path fails (vision-language wrappers such as Kimi-K2.5,
MLA verifiers whose hidden-state cache group is not isolated, vLLM < 0.18). vLLM loads
`HooksWorkerExtension` into each worker (`worker_extension_cls`); we call its methods with
`collective_rpc`. Hooks never fire under torch.compile / CUDA graphs, so this backend forces
`enforce_eager=True` (slower than native: use it only where native does not work).

Per forward step, on TP rank 0 only: a pre-hook on the model records the step's input ids and
positions; hooks on the decoder layers record the residual stream (hidden + residual, `layers.py`);
the rows are split per request with the runner's request order and query offsets
(`vllm_compat.current_batch_layout`), moved to host memory and accumulated. With chunked prefill a
prompt arrives over several steps: rows are ordered by position when collected. After each
`generate`, the driver collects every finished request's rows (`eb_collect`), as bytes so that it works
across processes too.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from eagle_batch import environment

from . import vllm_compat as compat
from .backend import VllmBackend
from .layers import residual_stream, validate_layer_ids
from .sink import CapturedRequest, Sink

log = logging.getLogger(__name__)


class HooksWorkerExtension:
    """Mixed into vLLM's worker class; methods are called through `collective_rpc`."""

    def eb_install_hooks(self, layer_ids: list[int]) -> int:
        if compat.tp_rank() != 0:
            return 0  # ranks hold identical replicas of the residual stream; one captures
        model = compat.worker_model(self)
        layers = compat.decoder_layers(model)
        n = len(layers)
        self._eb_ids = validate_layer_ids(layer_ids, n)
        self._eb_step: dict[int, torch.Tensor] = {}
        self._eb_acc: dict[str, list[tuple[np.ndarray, np.ndarray, torch.Tensor]]] = {}
        self._eb_inputs = None
        self._eb_handles = []
        want = set(self._eb_ids)

        def model_pre(_mod, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            pos = kwargs.get("positions", args[1] if len(args) > 1 else None)
            self._eb_inputs = (ids, pos)
            self._eb_step = {}

        self._eb_handles.append(model.register_forward_pre_hook(model_pre, with_kwargs=True))
        if 0 in want:

            def first_pre(_mod, args, kwargs):
                h = kwargs.get("hidden_states", args[1] if len(args) > 1 else None)
                self._eb_step[0] = h.detach()

            self._eb_handles.append(layers[0].register_forward_pre_hook(first_pre, with_kwargs=True))
        for k in sorted(want - {0}):

            def post(_mod, _args, out, k=k):
                self._eb_step[k] = residual_stream(out).detach()
                if k == max(want):
                    self._eb_finish_step()

            self._eb_handles.append(layers[k - 1].register_forward_hook(post))
        if want == {0}:
            raise ValueError("hooks backend: capture at least one layer id >= 1")
        return len(self._eb_handles)

    def _eb_finish_step(self) -> None:
        ids, pos = self._eb_inputs
        req_ids, starts = compat.current_batch_layout(self)
        T = int(starts[-1])
        states = torch.stack([self._eb_step[k][:T] for k in self._eb_ids], dim=1).to("cpu")
        ids_np = ids[:T].to("cpu").numpy() if ids is not None else np.full(T, -1)
        pos_np = pos[:T].to("cpu").numpy()
        for i, rid in enumerate(req_ids):
            a, b = int(starts[i]), int(starts[i + 1])
            if b > a:
                self._eb_acc.setdefault(rid, []).append((pos_np[a:b].copy(), ids_np[a:b].copy(), states[a:b].clone()))
        self._eb_step = {}

    def eb_collect(self) -> bytes | None:
        """Every accumulated request: {client request id: (token ids, states as uint16 bf16 or float32)}."""
        if compat.tp_rank() != 0:
            return None
        out = {}
        for rid, parts in self._eb_acc.items():
            pos = np.concatenate([p for p, _, _ in parts])
            order = np.argsort(pos, kind="stable")
            ids = np.concatenate([t for _, t, _ in parts])[order]
            st = torch.cat([s for _, _, s in parts])[torch.from_numpy(order)]
            if st.dtype == torch.bfloat16:
                payload = ("bf16", st.view(torch.int16).numpy())
            else:
                payload = (str(st.dtype).replace("torch.", ""), st.numpy())
            out[compat.strip_request_suffix(rid)] = (pos[order], ids, payload)
        self._eb_acc = {}
        return pickle.dumps(out, protocol=5)


def _decode(payload) -> torch.Tensor:
    kind, arr = payload
    if kind == "bf16":
        return torch.from_numpy(np.ascontiguousarray(arr)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(arr))


class HooksBackend(VllmBackend):
    name = "hooks"

    def __init__(self, cfg, layer_ids: list[int] | None = None):
        super().__init__(cfg, layer_ids)
        # The hooks read the V1 model runner's batch layout (vllm_compat.current_batch_layout); vLLM's
        # "model runner V2" (default on GPUs when Triton is present) keeps it elsewhere.
        environment.use_v1_model_runner()
        try:
            self._start(enforce_eager=True, worker_extension_cls="eagle_batch.capture.hooks.HooksWorkerExtension")
            res = self.llm.collective_rpc("eb_install_hooks", args=(self.layer_ids,))
            if not res or not res[0]:
                raise RuntimeError(f"hooks backend: rank 0 installed no hooks ({res})")
        except BaseException:
            self.close()
            raise

    def run_batch(self, samples: Sequence[Any], sink: Sink) -> None:
        outs = self.llm.generate(
            self._prompts(samples), [self._sampling_params(s.sample_id) for s in samples], use_tqdm=False
        )
        blobs = self.llm.collective_rpc("eb_collect")
        got = pickle.loads(next(b for b in blobs if b is not None))
        for s, o in zip(samples, outs):
            if o.request_id not in got:
                raise RuntimeError(
                    f"sample {s.sample_id}: hooks captured nothing for request {o.request_id} "
                    f"(captured: {sorted(got)[:5]}...)"
                )
            pos, ids, payload = got.pop(o.request_id)
            n = len(s.input_ids)
            if len(pos) != n or not np.array_equal(pos, np.arange(n)):
                raise RuntimeError(
                    f"sample {s.sample_id}: hooks saw positions {pos[:3]}..{pos[-3:]} "
                    f"({len(pos)} rows) for a {n}-token prompt; prefix caching must be off"
                )
            sink.put(CapturedRequest(s.sample_id, o.request_id, ids.astype(np.int64), _decode(payload), None))

"""The `native` capture backend: vLLM's `extract_hidden_states` speculative method + our KV connector.

The engine loads `EagleBatchConnector` (`connector.py`) through `kv_connector_module_path`; the connector
finds the capture's sink by a registry key when the worker runs in this process, else sends the rows
through the shared-memory ring (`shm.py`, TP>1 or vLLM's background engine process), whose receiver
feeds the same sink. One engine serves many batches: `_SinkProxy` forwards to the batch being run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eagle_batch import environment
from eagle_batch.config import RunConfig

from . import vllm_compat as compat
from .backend import VllmBackend
from .sink import Sink, register, unregister


class _SinkProxy(Sink):
    """Registered once per engine; forwards to the sink of the batch being run."""

    def __init__(self):
        self.target: Sink | None = None

    def put(self, item) -> None:
        if self.target is None:
            raise RuntimeError(f"captured sample {item.sample_id} arrived while no capture was running")
        self.target.put(item)


class NativeBackend(VllmBackend):
    name = "native"

    def __init__(self, cfg: RunConfig, layer_ids: list[int] | None = None):
        super().__init__(cfg, layer_ids)
        reason = compat.native_unsupported_reason()
        if reason:
            raise RuntimeError(reason)
        self._proxy = _SinkProxy()
        self._key = register(self._proxy)
        self._shm = None
        # eb_store_dtype: the connector quantizes float8 states on the device, before the copy to the host.
        extra: dict[str, Any] = {"eb_sink": self._key, "eb_store_dtype": cfg.store.dtype}
        self._place_engine()  # before deciding on the transport, which depends on it
        if self.cfg.model.tensor_parallel_size > 1 or environment.vllm_multiprocessing():
            # The worker (TP rank 0) will be another process: it sends states through shared memory.
            from .shm import ShmReceiver

            self._shm = ShmReceiver(self._proxy, cfg.extract.shm_bytes or None)
            extra["eb_shm"] = self._shm.spec()
        try:
            self._start(
                speculative_config=compat.speculative_config(self.layer_ids),
                kv_transfer_config=compat.kv_transfer_config(
                    "EagleBatchConnector", "eagle_batch.capture.connector", extra
                ),
            )
        except BaseException:
            self.close()
            raise

    def run_batch(self, samples: Sequence[Any], sink: Sink) -> None:
        self._proxy.target = sink
        try:
            start = self._shm.received if self._shm is not None else 0
            self.llm.generate(
                self._prompts(samples), [self._sampling_params(s.sample_id) for s in samples], use_tqdm=False
            )
            if self._shm is not None:  # records from another process may still be in flight
                self._shm.wait_for(len(samples), start)
        finally:
            self._proxy.target = None

    def close(self) -> None:
        super().close()
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        unregister(self._key)

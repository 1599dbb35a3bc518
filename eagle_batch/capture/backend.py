"""Capture backends: what `run_capture` needs from an engine, and how one is chosen and started.

    with open_backend(cfg) as backend:                       # engine start: once per task
        stats = run_capture(cfg, samples, writer, should_stop=task.should_stop, backend=backend)

Backends (`extract.backend`), each in a module of its own, registered in `BACKENDS`:
- `native` (`native.py`): vLLM's `extract_hidden_states` speculative method + our `EagleBatchConnector`
  (`connector.py`); states go from the worker straight to the `WriterThread` (`writer.py`).
- `hooks` (`hooks.py`): a vLLM worker extension with forward hooks on the decoder layers; for models or
  versions where native fails. Forces enforce_eager (hooks never fire under torch.compile).
- `hf` (`hf.py`): transformers forward; the reference, slow.
- `auto`: native, falling back to hooks with the reason logged when native cannot start.

vLLM engine settings always applied (`VllmBackend`): prompts as token ids (TokensPrompt), max_tokens=1,
prefix caching OFF (it would skip the tokens whose states we need), one SamplingParams per request
carrying its sample id.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from eagle_batch import environment
from eagle_batch.config import RunConfig, model_info, resolve_layer_ids
from eagle_batch.config.remote_code import engine_remote_code

from . import vllm_compat as compat
from .sink import Sink
from .writer import CaptureError

log = logging.getLogger(__name__)


class CaptureBackend(Protocol):
    """A started engine that captures the states of `layer_ids` (`hidden_size` wide) for given samples."""

    name: str
    layer_ids: list[int]
    hidden_size: int

    def run_batch(self, samples: Sequence[Any], sink: Sink) -> None:
        """Run `samples` through the model; every sample's CapturedRequest has reached `sink` on return."""

    def close(self) -> None: ...


# extract.backend -> "module:class" (imported when chosen; vLLM is imported only when an engine starts).
BACKENDS = {
    "native": "eagle_batch.capture.native:NativeBackend",
    "hooks": "eagle_batch.capture.hooks:HooksBackend",
    "hf": "eagle_batch.capture.hf:HFBackend",
}
CHOICES = (*BACKENDS, "auto")


def backend_class(name: str) -> type:
    mod, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(mod), cls)


class VllmBackend:
    """Shared engine construction of the native and hooks backends."""

    name = "?"

    def __init__(self, cfg: RunConfig, layer_ids: list[int] | None = None):
        self.cfg = cfg
        self.info = model_info(cfg.model.path)
        self.layer_ids = list(layer_ids) if layer_ids is not None else resolve_layer_ids(cfg.model, self.info)
        self.hidden_size = self.info.hidden_size
        self.llm = None

    def engine_kwargs(self) -> dict[str, Any]:
        m, e = self.cfg.model, self.cfg.extract
        kw: dict[str, Any] = dict(
            model=m.path,
            tokenizer=m.tokenizer or m.path,
            dtype=m.dtype,
            tensor_parallel_size=m.tensor_parallel_size,
            max_model_len=m.max_model_len,
            gpu_memory_utilization=e.gpu_memory_utilization,
            enable_prefix_caching=False,
            enable_chunked_prefill=e.enable_chunked_prefill,
            max_num_seqs=e.max_num_seqs,
            max_num_batched_tokens=e.max_num_batched_tokens,
            enforce_eager=e.enforce_eager,
            trust_remote_code=engine_remote_code(m),
            skip_tokenizer_init=True,  # prompts are token ids; lets random-vocab models run without a tokenizer
        )
        if m.revision:
            kw["revision"] = m.revision
        kw.update(compat.cpu_mla_engine_args(self.info.uses_mla, m.dtype))
        kw.update(dict(self.cfg.extract.extra_engine_args or {}))
        return kw

    def _sampling_params(self, sample_id: str):
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=1,
            temperature=0.0,
            detokenize=False,
            extra_args={"kv_transfer_params": {"eb_sample_id": str(sample_id)}},
        )

    def _prompts(self, samples):
        return [compat.tokens_prompt([int(t) for t in s.input_ids]) for s in samples]

    def _start(self, **extra) -> None:
        from vllm import LLM

        kw = self.engine_kwargs()
        kw.update(extra)
        self._place_engine()
        start_engine_defaults(self.name)
        log.info(
            "starting vLLM %s (%s backend): %s",
            compat.vllm_version(),
            self.name,
            {k: v for k, v in kw.items() if k not in ("speculative_config", "kv_transfer_config")},
        )
        self.llm = LLM(**kw)

    def _place_engine(self) -> None:
        """TP=1: run the engine where extract.engine_process says (vLLM reads the variable when the engine
        starts); a user's explicit VLLM_ENABLE_V1_MULTIPROCESSING wins."""
        if self.cfg.model.tensor_parallel_size == 1:
            environment.set_vllm_multiprocessing_default(self._engine_in_background())

    def _engine_in_background(self) -> bool:
        """extract.engine_process for TP=1 (see ExtractConfig): True = vLLM's engine-core process."""
        mode = self.cfg.extract.engine_process
        if mode not in ("auto", "in-process", "background"):
            raise CaptureError(f"extract.engine_process={mode!r}: choose auto, in-process or background")
        if mode != "auto":
            return mode == "background"
        if self.name != "native":
            return False
        import torch

        return torch.cuda.is_available()

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
            import gc

            gc.collect()


def start_engine_defaults(what: str) -> None:
    """What every vLLM engine eagle-batch starts needs from the environment (a CPU engine's KV cache), and
    its task log without the warnings it gets by design (vllm_compat.EXPECTED_WARNINGS)."""
    import torch

    compat.quiet_expected_warnings()

    gib = environment.set_cpu_kv_cache_default(torch.cuda.is_available())
    if gib is not None:
        log.info("%s engine on the CPU: VLLM_CPU_KVCACHE_SPACE=%s GiB (set it to choose)", what, gib)


def make_backend(cfg: RunConfig, backend: str | None = None, layer_ids: list[int] | None = None) -> CaptureBackend:
    """Start the engine of `backend` (default cfg.extract.backend); `auto` falls back native -> hooks."""
    name = backend or cfg.extract.backend
    if name not in CHOICES:
        raise CaptureError(f"extract.backend={name!r}: choose one of {', '.join(CHOICES)}")
    if name != "auto":
        return backend_class(name)(cfg, layer_ids)
    try:
        return backend_class("native")(cfg, layer_ids)
    except Exception as e:  # noqa: BLE001 - logged with the reason, then the fallback
        log.warning("native capture backend unavailable (%s: %s); falling back to hooks", type(e).__name__, e)
        return backend_class("hooks")(cfg, layer_ids)


@contextlib.contextmanager
def open_backend(cfg: RunConfig, backend: str | None = None, layer_ids: list[int] | None = None):
    b = make_backend(cfg, backend, layer_ids)
    try:
        yield b
    finally:
        b.close()

"""Capture engines and `run_capture`, the entry point the Slurm task calls.

    with open_backend(cfg) as backend:                       # engine start: once per task
        stats = run_capture(cfg, samples, writer, should_stop=task.should_stop, backend=backend)

Backends (`extract.backend`):
- `native`: vLLM's `extract_hidden_states` speculative method + our `EagleBatchConnector`
  (`connector.py`); states go from the worker straight to the `WriterThread` (`writer.py`).
- `hooks`: a vLLM worker extension with forward hooks on the decoder layers (`hooks.py`); for models
  or versions where native fails. Forces enforce_eager (hooks never fire under torch.compile).
- `hf`: transformers forward (`hf.py`); the reference, slow.
- `auto`: native, falling back to hooks with the reason logged when native cannot start.

Engine settings always applied: prompts as token ids (TokensPrompt), max_tokens=1, prefix caching OFF
(it would skip the tokens whose states we need), one SamplingParams per request carrying its sample id.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from eagle_batch.config import RunConfig, model_info, resolve_layer_ids

from . import vllm_compat as compat
from .sink import Sink, register, unregister
from .writer import CaptureError, WriterThread

log = logging.getLogger(__name__)

BACKENDS = ("native", "hooks", "hf", "auto")


def _check_lengths(cfg: RunConfig, samples: Sequence[Any]) -> None:
    for s in samples:
        n = len(s.input_ids)
        if n == 0:
            raise CaptureError(f"sample {s.sample_id}: empty input_ids; re-run prepare (it drops empty rows).")
        if n >= cfg.model.max_model_len:  # vLLM needs the prompt plus the one token it generates
            raise CaptureError(
                f"sample {s.sample_id}: {n} tokens, model.max_model_len={cfg.model.max_model_len} "
                f"allows {cfg.model.max_model_len - 1}; raise model.max_model_len or lower "
                "data.max_length and re-run prepare."
            )
        if len(s.loss_mask) != n:
            raise CaptureError(f"sample {s.sample_id}: loss_mask has {len(s.loss_mask)} entries for {n} tokens.")


def _chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    n = max(1, int(n))
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


class _SinkProxy(Sink):
    """Registered once per engine; forwards to the sink of the batch being run."""

    def __init__(self):
        self.target: Sink | None = None

    def put(self, item) -> None:
        if self.target is None:
            raise RuntimeError(f"captured sample {item.sample_id} arrived while no capture was running")
        self.target.put(item)


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
            trust_remote_code=m.trust_remote_code,
            skip_tokenizer_init=True,  # prompts are token ids; lets random-vocab models run without a tokenizer
        )
        if m.revision:
            kw["revision"] = m.revision
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
        log.info(
            "starting vLLM %s (%s backend): %s",
            compat.vllm_version(),
            self.name,
            {k: v for k, v in kw.items() if k not in ("speculative_config", "kv_transfer_config")},
        )
        self.llm = LLM(**kw)

    def _place_engine(self) -> None:
        """TP=1: run the engine where extract.engine_process says (vLLM reads the variable when the engine
        starts). setdefault: a user's explicit VLLM_ENABLE_V1_MULTIPROCESSING wins."""
        if self.cfg.model.tensor_parallel_size == 1:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if self._engine_in_background() else "0")

    def _engine_in_background(self) -> bool:
        """extract.engine_process for TP=1 (see ExtractConfig): True = vLLM's engine-core process."""
        mode = str(getattr(self.cfg.extract, "engine_process", "auto"))
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
        extra: dict[str, Any] = {"eb_sink": self._key}
        self._place_engine()  # before deciding on the transport, which depends on it
        if self.cfg.model.tensor_parallel_size > 1 or compat.multiprocessing_enabled():
            # The worker (TP rank 0) will be another process: it sends states through shared memory.
            from .shm import ShmReceiver

            self._shm = ShmReceiver(self._proxy)
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


def make_backend(cfg: RunConfig, backend: str | None = None, layer_ids: list[int] | None = None):
    """Start the engine of `backend` (default cfg.extract.backend); `auto` falls back native -> hooks."""
    name = backend or cfg.extract.backend
    if name not in BACKENDS:
        raise CaptureError(f"extract.backend={name!r}: choose one of {', '.join(BACKENDS)}")
    if name == "native":
        return NativeBackend(cfg, layer_ids)
    if name == "hooks":
        from .hooks import HooksBackend

        return HooksBackend(cfg, layer_ids)
    if name == "hf":
        from .hf import HFBackend

        return HFBackend(cfg, layer_ids)
    try:
        return NativeBackend(cfg, layer_ids)
    except Exception as e:  # noqa: BLE001 - logged with the reason, then the fallback
        log.warning("native capture backend unavailable (%s: %s); falling back to hooks", type(e).__name__, e)
        from .hooks import HooksBackend

        return HooksBackend(cfg, layer_ids)


@contextlib.contextmanager
def open_backend(cfg: RunConfig, backend: str | None = None, layer_ids: list[int] | None = None):
    b = make_backend(cfg, backend, layer_ids)
    try:
        yield b
    finally:
        b.close()


@dataclass
class CaptureStats:
    backend: str = ""
    samples: int = 0
    tokens: int = 0
    skipped_committed: int = 0
    commits: int = 0
    seconds: float = 0.0
    tokens_per_s: float = 0.0
    stopped_early: bool = False
    writer_busy_s: float = 0.0  # the writer thread's time in append (checks, hand-over to the store)
    backpressure_s: float = 0.0  # time the engine side waited because the store was behind

    def as_dict(self) -> dict:
        return asdict(self)


def run_capture(
    cfg: RunConfig,
    samples: Sequence[Any],
    writer,
    should_stop: Callable[[], bool] | None = None,
    backend=None,
    max_pending_bytes: int = 4 << 30,
) -> CaptureStats:
    """Capture every sample not yet committed in `writer` and append it; see the module docstring.

    Commits at most every `extract.commit_interval_s` (between batches, on the writer thread, so the
    engine keeps computing) and always at the end, or when `should_stop()` turns true (checked after
    each batch; the function then commits and returns). `backend`: a started backend to reuse (tests,
    benchmarks); by default one is started from the config and shut down on return.
    """
    t0 = time.perf_counter()
    committed = set(writer.committed_sample_ids)
    todo = [s for s in samples if s.sample_id not in committed]
    stats = CaptureStats(skipped_committed=len(samples) - len(todo))
    ids = [s.sample_id for s in todo]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CaptureError(f"sample {dup}: sample id appears more than once in this task's samples")
    _check_lengths(cfg, todo)
    if not todo:
        stats.seconds = time.perf_counter() - t0
        return stats
    own = backend is None
    if own:
        backend = make_backend(cfg)
    stats.backend = backend.name
    wt = WriterThread(
        writer,
        len(backend.layer_ids),
        backend.hidden_size,
        cfg.extract.check_finite,
        max_pending_bytes=max_pending_bytes,
    )
    try:
        last_commit = time.monotonic()
        for batch in _chunks(todo, cfg.extract.batch_samples):
            wt.expect(batch)
            backend.run_batch(batch, wt)
            wt.raise_if_failed()
            if time.monotonic() - last_commit >= cfg.extract.commit_interval_s:
                wt.commit(wait=False)  # queued behind this batch's appends; the next batch starts now
                last_commit = time.monotonic()
            if should_stop is not None and should_stop():
                stats.stopped_early = True
                break
        wt.commit(wait=True)
        wt.close()
    except BaseException:
        with contextlib.suppress(BaseException):
            wt.close()
        raise
    finally:
        if own:
            backend.close()
    stats.samples, stats.tokens, stats.commits = wt.stats.samples, wt.stats.tokens, wt.stats.commits
    stats.writer_busy_s, stats.backpressure_s = wt.stats.write_s, wt.stats.put_wait_s
    stats.seconds = time.perf_counter() - t0
    stats.tokens_per_s = stats.tokens / stats.seconds if stats.seconds > 0 else 0.0
    return stats

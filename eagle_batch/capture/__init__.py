"""Hidden-state capture: vLLM (native connector or hooks) or transformers -> the task's store writer.

    from eagle_batch.capture import run_capture, open_backend
    stats = run_capture(cfg, samples, writer, should_stop=...)

Modules: `engine` (backends, run_capture), `connector` (our vLLM KV connector), `hooks` (fallback),
`hf` (reference), `writer` (checks + the store-writer thread), `layers` (layer-id semantics),
`vllm_compat` (everything vLLM-version-dependent), `validate` / `cli_validate` (`eagle-batch validate`).
vLLM is imported only when an engine starts.
"""

from .engine import BACKENDS, CaptureStats, make_backend, open_backend, run_capture
from .writer import CaptureError, check_captured

__all__ = ["BACKENDS", "CaptureError", "CaptureStats", "check_captured", "make_backend", "open_backend", "run_capture"]

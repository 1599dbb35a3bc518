"""Checks run before anything is submitted: each failure names the key or file and the fix.

omegaconf already rejects unknown keys and wrong types (load.py); `check_values` rejects values of the right
type that mean nothing (tables ENUMS and RANGES, then the checks across keys), the other checks need the file
system or the model's own files. Every command checks every section: one file configures all stages, so a
nonsense value fails at the first command, before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .load import (
    DATA_SECTIONS,
    PLANNED_NAME,
    REGENERATE_SECTIONS,
    RESOLVED_NAME,
    ConfigError,
    config_hash,
    data_dict,
    dotted_leaves,
    load_config,
)
from .model_info import ModelInfo, model_info, resolve_layer_ids
from .schema import RunConfig

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json", "tokenizer_config.json")
SECTIONS = ("model", "data", "extract", "store", "slurm", "train", "regenerate")
ENUMS = {
    "data.format": ("auto", "messages", "sharegpt", "prompt_response", "alpaca"),
    "data.on_bad_row": ("skip", "error"),
    "train.on_damaged": ("fail", "skip"),
    "data.non_prefix_stable": ("error", "per_turn"),
    "data.empty_assistant_turns": ("mask", "skip", "keep"),
    "regenerate.turns": ("all", "last"),
    "extract.backend": ("auto", "native", "hooks", "hf"),
    "extract.engine_process": ("auto", "background", "in-process"),
    "store.codec": ("blosc-zstd", "zstd", "none"),
    "store.dtype": ("bfloat16", "float8_e4m3", "float8_e5m2"),
    "slurm.executor": ("auto", "slurm", "local"),
    "slurm.container.runtime": ("none", "apptainer", "pyxis"),
    "train.precision": ("bf16", "fp32"),
    "train.optimizer": ("adamw", "muon"),
    "train.ttt_attention": ("merged", "masked"),
    "train.lm_head_init": ("random", "target"),
    "train.accuracy_vs": ("full", "draft"),
    "model.dtype": ("bfloat16", "float16", "float32", "auto"),
}


@dataclass(frozen=True)
class Range:
    """The values a numeric key may take: `low`..`high` (None: unbounded), each end included unless
    `*_open`. Non-finite floats never fit. `meaning` says what edge values do (0 = auto / off ...)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    meaning: str = ""

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


def _at_least(low: int, meaning: str = "") -> Range:
    return Range(low, meaning=meaning)


POSITIVE = Range(0, low_open=True)
FRACTION = Range(0, 1, low_open=True)  # a share of something: none of it is nothing
SEED = Range(0, 2**32 - 1, meaning="numpy's seeds are unsigned 32-bit")

# Every numeric key of the schema (tests/config/test_value_ranges.py checks none is left out): a Range, or a
# function of the config giving the Range (one that depends on another key) or None (no range applies).
RANGES: dict[str, Range | Callable[[RunConfig], Range | None]] = {
    "model.tensor_parallel_size": _at_least(1),
    "model.max_model_len": _at_least(1),
    "data.max_length": _at_least(1),
    "data.min_loss_tokens": _at_least(0, "samples with fewer loss tokens are dropped; one with none always is"),
    "data.limit": _at_least(0, "0 reads every row"),
    "data.max_row_bytes": _at_least(0, "0 removes the cap on one record's bytes"),
    "data.max_decompressed_bytes": _at_least(0, "0 removes the cap on a .gz input's decompressed bytes"),
    "data.max_message_chars": _at_least(0, "0 removes the cap on one message's characters"),
    "extract.num_tasks": _at_least(1),
    "extract.max_num_seqs": _at_least(1),
    "extract.max_num_batched_tokens": _at_least(1),
    "extract.gpu_memory_utilization": FRACTION,
    "extract.shm_bytes": _at_least(0, "0 = min(8 GiB, half of the free /dev/shm)"),
    "extract.batch_samples": _at_least(1),
    "extract.commit_interval_s": _at_least(0, "0 commits after every batch"),
    "extract.validate_min_cosine": Range(-1, 1, meaning="a cosine similarity"),
    "extract.validate_max_rel_err": _at_least(0),
    "extract.synthetic_sample_s": _at_least(0, "seconds"),
    "store.level": lambda cfg: STORE_LEVELS.get(cfg.store.codec),
    "store.blocksize": _at_least(0, "bytes; 0 lets c-blosc choose"),
    "store.chunk_tokens": _at_least(0, "0 = about 4 MiB chunks"),
    "store.shard_tokens": _at_least(1),
    "store.encode_threads": _at_least(0, "0 = every CPU of the allocation but two"),
    "store.io_threads": _at_least(0, "0 = as many as shard writes may be queued"),
    "regenerate.num_tasks": _at_least(1),
    "regenerate.temperature": Range(0, 2, meaning="vLLM's range; 0 = greedy"),
    "regenerate.top_p": FRACTION,
    "regenerate.top_k": _at_least(-1, "-1 or 0 = no top-k limit"),
    "regenerate.max_tokens": _at_least(1),
    "regenerate.seed": SEED,
    "regenerate.batch_conversations": _at_least(1),
    "regenerate.gpu_memory_utilization": FRACTION,
    "slurm.nodes": _at_least(1),
    "slurm.gpus_per_node": _at_least(0, "0 = no GPU"),
    "slurm.cpus_per_task": _at_least(1),
    "slurm.mem_gb": _at_least(0, "0 = do not ask"),
    "slurm.time_min": _at_least(1, "minutes"),
    "slurm.array_parallelism": _at_least(1),
    "slurm.max_array_size": _at_least(0, "0 = the cluster's MaxArraySize"),
    "slurm.tasks_per_gpu_group": _at_least(1),
    "slurm.signal_delay_s": _at_least(0),
    "slurm.max_attempts": _at_least(1),
    "slurm.max_num_timeout": _at_least(0, "0 = no requeue after a time limit"),
    "train.steps": _at_least(0, "0 trains nothing and exports the initial draft, a baseline"),
    "train.epochs": _at_least(0, "0 = train.steps decides"),
    "train.time_budget_s": _at_least(0, "0 = off"),
    "train.max_time_s": _at_least(0, "0 = off"),
    "train.max_restarts": _at_least(0, "0 = a crash ends the training"),
    "train.lr": POSITIVE,
    "train.min_lr_ratio": Range(0, 1, meaning="the final learning rate as a share of train.lr"),
    "train.warmup_steps": _at_least(0),
    "train.weight_decay": _at_least(0),
    "train.batch_tokens": _at_least(1),
    "train.max_length": _at_least(1),
    "train.ttt_steps": _at_least(1),
    "train.ttt_decay": POSITIVE,
    "train.grad_clip": _at_least(0, "0 = no clipping"),
    "train.seed": SEED,
    "train.draft_vocab_size": _at_least(1),
    "train.num_workers": _at_least(0, "0 loads batches in the training process"),
    "train.prefetch_factor": _at_least(1),
    "train.checkpoint_every": _at_least(1),
    "train.log_every": _at_least(1),
    "train.draft_intermediate_size": _at_least(0, "0 = the target's"),
    "train.draft_num_heads": _at_least(0, "0 = the target's"),
    "train.draft_num_kv_heads": _at_least(0, "0 = the target's"),
    "train.holdout_fraction": Range(0, 0.5, meaning="the share of samples held out; 0 = none"),
    "train.follow_start_fraction": Range(0, 1, meaning="the share of task stores complete; 0 = the first commit"),
    "train.follow_poll_s": POSITIVE,
    "train.follow_timeout_s": _at_least(0, "0 = wait without end"),
}
# The compression levels each codec's library accepts (c-blosc's clevel; zstd's, negative = its fast levels,
# 0 = its default); codec none compresses nothing, so its level is not checked.
STORE_LEVELS = {
    "blosc-zstd": Range(0, 9, meaning="c-blosc's clevel; 0 stores uncompressed"),
    "zstd": Range(-131072, 22, meaning="zstd's levels; negative = fast, 0 = default"),
}


def _get(cfg: RunConfig, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _in_sections(key: str, sections: Iterable[str]) -> bool:
    return key.split(".", 1)[0] in sections


def check_values(cfg: RunConfig, sections: Iterable[str] = SECTIONS) -> None:
    """Every value of `sections` against ENUMS and RANGES, then the checks across keys; the first failure
    raises ConfigError naming the key, the value and what it must be."""
    sections = tuple(sections)
    _check_enums(cfg, sections)
    _check_ranges(cfg, sections)
    for section, check in CROSS_CHECKS:
        if section in sections:
            check(cfg)


def _check_enums(cfg: RunConfig, sections: tuple[str, ...]) -> None:
    for key, allowed in ENUMS.items():
        value = _get(cfg, key)
        if _in_sections(key, sections) and value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}.")


def _check_ranges(cfg: RunConfig, sections: tuple[str, ...]) -> None:
    for key, rule in RANGES.items():
        if not _in_sections(key, sections):
            continue
        allowed = rule if isinstance(rule, Range) else rule(cfg)
        value = _get(cfg, key)
        if allowed is not None and not allowed.holds(value):
            meaning = f" ({allowed.meaning})" if allowed.meaning else ""
            raise ConfigError(f"{key}={value} must be {allowed.describe()}{meaning}.")


def _check_shard_chunks(cfg: RunConfig) -> None:
    if cfg.store.chunk_tokens and cfg.store.shard_tokens % cfg.store.chunk_tokens:
        raise ConfigError(
            f"store.shard_tokens={cfg.store.shard_tokens} must be a multiple of "
            f"store.chunk_tokens={cfg.store.chunk_tokens}."
        )


def _check_sample_fits_engine(cfg: RunConfig) -> None:
    if cfg.data.max_length >= cfg.model.max_model_len:
        raise ConfigError(
            f"data.max_length={cfg.data.max_length} must be below model.max_model_len="
            f"{cfg.model.max_model_len}: vLLM needs room for the prompt plus the one token it "
            f"generates, so samples can be at most max_model_len - 1 tokens. Set data.max_length="
            f"{cfg.model.max_model_len - 1} or model.max_model_len={cfg.data.max_length + 1}."
        )


def _check_gpus_for_tp(cfg: RunConfig) -> None:
    tp, gpus = cfg.model.tensor_parallel_size, cfg.slurm.gpus_per_node * cfg.slurm.nodes
    if cfg.slurm.gpus_per_node > 0 and tp > gpus:
        raise ConfigError(
            f"model.tensor_parallel_size={tp} needs {tp} GPUs per task but slurm.gpus_per_node="
            f"{cfg.slurm.gpus_per_node} x slurm.nodes={cfg.slurm.nodes} gives {gpus}; raise "
            "slurm.gpus_per_node or lower model.tensor_parallel_size."
        )


def _check_gpu_group_sharing(cfg: RunConfig) -> None:
    if cfg.slurm.tasks_per_gpu_group > 1 and not cfg.slurm.share_devices:
        raise ConfigError(
            f"slurm.tasks_per_gpu_group={cfg.slurm.tasks_per_gpu_group} runs tasks side by side on one GPU group, "
            "which only slurm.share_devices=true allows (each engine then keeps to its gpu_memory_utilization "
            "share); set slurm.share_devices=true, or slurm.tasks_per_gpu_group=1."
        )


def _check_signal_before_limit(cfg: RunConfig) -> None:
    """A checkpoint signal due at or before the start would stop every attempt at once, requeue after requeue."""
    sc = cfg.slurm
    if sc.signal_delay_s >= 60 * sc.time_min:
        raise ConfigError(
            f"slurm.signal_delay_s={sc.signal_delay_s} must be below the time limit, slurm.time_min={sc.time_min} "
            f"({60 * sc.time_min} s): tasks get the checkpoint signal that long before the limit; lower "
            "slurm.signal_delay_s or raise slurm.time_min."
        )


def _check_budget_has_steps(cfg: RunConfig) -> None:
    """train.steps=0 (no epochs) ends the run before its first step, where a time budget would take over."""
    tc = cfg.train
    if tc.steps == 0 and tc.epochs == 0 and tc.time_budget_s > 0:
        raise ConfigError(
            f"train.time_budget_s={tc.time_budget_s:g} never applies with train.steps=0, which trains nothing "
            "and exports the initial draft; set train.steps to a positive number (the budget then refits the "
            "schedule), or train.time_budget_s=0 for the untrained baseline."
        )


def _check_draft_heads(cfg: RunConfig) -> None:
    heads, kv = cfg.train.draft_num_heads, cfg.train.draft_num_kv_heads
    if heads and kv and heads % kv:
        raise ConfigError(
            f"train.draft_num_kv_heads={kv} must divide train.draft_num_heads={heads} (each KV head serves a "
            "group of query heads); change either, or set both to 0 for the target's."
        )


# The checks across keys, each with the section whose values it judges.
CROSS_CHECKS: tuple[tuple[str, Callable[[RunConfig], None]], ...] = (
    ("store", _check_shard_chunks),
    ("data", _check_sample_fits_engine),
    ("slurm", _check_gpus_for_tp),
    ("slurm", _check_gpu_group_sharing),
    ("slurm", _check_signal_before_limit),
    ("train", _check_budget_has_steps),
    ("train", _check_draft_heads),
)


def check_model_files(cfg: RunConfig) -> ModelInfo:
    path = Path(cfg.model.path)
    if not path.is_dir():
        raise ConfigError(
            f"model.path={path} is not a folder; download the model once (outside the job) "
            "and point model.path at the local copy."
        )
    info = model_info(path)
    if not any(next(path.glob(p), None) for p in WEIGHT_PATTERNS):
        raise ConfigError(
            f"model.path={path}: no weight files ({', '.join(WEIGHT_PATTERNS)}); the download may be incomplete."
        )
    check_tokenizer_files(cfg.model.tokenizer or cfg.model.path, tokenizer_key(cfg))
    tp = cfg.model.tensor_parallel_size
    heads, kv = info.num_attention_heads, info.num_key_value_heads
    if heads and heads % tp:
        raise ConfigError(
            f"model.tensor_parallel_size={tp} does not divide the model's "
            f"num_attention_heads={heads}; use a divisor of {heads}."
        )
    if kv and kv % tp and tp % kv:
        raise ConfigError(
            f"model.tensor_parallel_size={tp} and num_key_value_heads={kv}: one must divide "
            "the other for vLLM to shard or replicate KV heads."
        )
    check_fits_model(cfg, info)
    return info


def tokenizer_key(cfg: RunConfig) -> str:
    """The config key that names the tokenizer's folder (model.tokenizer when set, else model.path)."""
    return "model.tokenizer" if cfg.model.tokenizer else "model.path"


def check_tokenizer_files(folder: str | Path, key: str) -> None:
    """ConfigError unless `folder` (named by config key `key`) holds one of TOKENIZER_FILES: without any of
    them transformers fails with a message about slow-tokenizer conversion that names neither."""
    if not any((Path(folder) / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(
            f"{key}={folder}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); point {key} at the model "
            "folder that has them, or set model.tokenizer to a folder that does."
        )


def check_fits_model(cfg: RunConfig, info: ModelInfo) -> None:
    """Layer ids and model.max_model_len against the model's own config.json (vLLM refuses a max_model_len
    beyond the model's positions at engine start, inside every task)."""
    resolve_layer_ids(cfg.model, info)
    if info.max_positions and cfg.model.max_model_len > info.max_positions:
        raise ConfigError(
            f"model.max_model_len={cfg.model.max_model_len} is more than the model's "
            f"max_position_embeddings={info.max_positions} ({cfg.model.path}/config.json); vLLM "
            f"refuses it. Set model.max_model_len={info.max_positions} and data.max_length="
            f"{info.max_positions - 1} or less."
        )


def check_tokenizer(cfg: RunConfig, tokenizer, info: ModelInfo) -> None:
    """The tokenizer must fit the model's embedding table and have a chat template."""
    n = len(tokenizer)
    if info.vocab_size and n > info.vocab_size:
        raise ConfigError(
            f"tokenizer at {cfg.model.tokenizer or cfg.model.path} has {n} tokens but the model's "
            f"vocab_size is {info.vocab_size}: it belongs to another model; fix model.tokenizer."
        )
    if not cfg.model.chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"tokenizer at {cfg.model.tokenizer or cfg.model.path} has no chat template; set "
            "model.chat_template to a Jinja file with the model's template."
        )
    if cfg.model.chat_template and not Path(cfg.model.chat_template).is_file():
        raise ConfigError(f"model.chat_template={cfg.model.chat_template} does not exist.")


def claim_run_dir(cfg: RunConfig, force: bool = False) -> None:
    """Refuse a run directory that already belongs to a run with a different data config (DATA_SECTIONS).

    The values are checked first: a nonsense value is reported as such, not as a difference from the run."""
    check_values(cfg)
    existing = Path(cfg.run_dir) / RESOLVED_NAME
    if not existing.is_file() or force:
        return
    fix = "choose a new run_dir, or pass --force to reuse it"
    try:
        theirs = load_config(existing)
    except ConfigError as e:
        raise ConfigError(
            f"run_dir={cfg.run_dir} already holds another run whose {RESOLVED_NAME} cannot be read ({e}); {fix}."
        ) from None
    differ = plan_differences(theirs, cfg, DATA_SECTIONS)
    if not differ:
        return
    raise ConfigError(f"run_dir={cfg.run_dir} already holds another run with other data settings ({differ}); {fix}.")


SHOWN_DIFFERENCES = 3


def describe_differences(theirs: RunConfig, ours: RunConfig, sections: Iterable[str] = DATA_SECTIONS) -> str:
    """'data.limit: 40 in the run, 30 now; ...' for the first few keys of `sections` that differ."""
    differences = config_differences(theirs, ours, sections)
    shown = [f"{key}: {old!r} in the run, {new!r} now" for key, old, new in differences[:SHOWN_DIFFERENCES]]
    more = len(differences) - SHOWN_DIFFERENCES
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def config_differences(
    theirs: RunConfig, ours: RunConfig, sections: Iterable[str] = DATA_SECTIONS
) -> list[tuple[str, object, object]]:
    """(dotted key, their value, our value) for each leaf of `sections` that differs, in schema order."""
    a = dotted_leaves(data_dict(theirs, tuple(sections)))
    b = dotted_leaves(data_dict(ours, tuple(sections)))
    keys = list(a) + [k for k in b if k not in a]
    return [(k, a.get(k), b.get(k)) for k in keys if a.get(k, _ABSENT) != b.get(k, _ABSENT)]


_ABSENT = object()


def check_prepared_fits(cfg: RunConfig, prepared_max_tokens: int, where: str) -> None:
    """The longest prepared sample must fit the engine (checked before submit: the config may have changed)."""
    if prepared_max_tokens >= cfg.model.max_model_len:
        raise ConfigError(
            f"{where} holds samples of up to {prepared_max_tokens} tokens, but model.max_model_len="
            f"{cfg.model.max_model_len} allows at most {cfg.model.max_model_len - 1} (the prompt plus "
            f"the one token vLLM generates); set model.max_model_len={prepared_max_tokens + 1}, or "
            f"re-run prepare with data.max_length={cfg.model.max_model_len - 1}."
        )


def check_config(cfg: RunConfig, need_model: bool = True) -> ModelInfo | None:
    check_values(cfg)
    return check_model_files(cfg) if need_model else None


def plan_sections(cfg: RunConfig) -> tuple[str, ...]:
    """The sections a run's plan depends on: a regeneration's, or an extraction's data sections."""
    return REGENERATE_SECTIONS if cfg.extract.work == "regenerate" else DATA_SECTIONS


def planned_config(run_dir: str | Path) -> RunConfig | None:
    """The config RUN's plan was made with (RUN/prepared/planned.yaml), None for a run planned without one."""
    p = Path(run_dir) / "prepared" / PLANNED_NAME
    return load_config(p) if p.is_file() else None


def plan_differences(theirs: RunConfig, ours: RunConfig, sections: Iterable[str]) -> str:
    """ "" when `ours` plans like `theirs` (the same hash over `sections`), else what differs (describe_differences)."""
    sections = list(sections)
    if config_hash(theirs, sections) == config_hash(ours, sections):
        return ""
    return describe_differences(theirs, ours, sections) or "settings of " + ", ".join(sections)


def check_plan_settings(cfg: RunConfig) -> None:
    """ConfigError when cfg (RUN/config.yaml as it is now) changes settings the run's plan was made with: the
    remaining tasks would work under other settings than the finished ones (a mixed output)."""
    theirs = planned_config(cfg.run_dir)
    differ = plan_differences(theirs, cfg, plan_sections(cfg)) if theirs is not None else ""
    if not differ:
        return
    raise ConfigError(
        f"{cfg.run_dir}/{RESOLVED_NAME} was changed since the run was planned "
        f"({differ}): the tasks left would work under other settings than "
        f"the finished ones. Restore the planned values (kept in {cfg.run_dir}/prepared/{PLANNED_NAME}), or plan "
        "a new run in a new folder. Nothing was submitted."
    )

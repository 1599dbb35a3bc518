"""Checks run before anything is submitted: each failure names the key or file and the fix.

omegaconf already rejects unknown keys and wrong types (load.py); these are the checks that need the
file system or the model's own files.
"""

from __future__ import annotations

from pathlib import Path

from .load import RESOLVED_NAME, ConfigError, config_hash, load_config
from .model_info import ModelInfo, model_info, resolve_layer_ids
from .schema import RunConfig

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json", "tokenizer_config.json")
ENUMS = {
    "data.format": ("auto", "messages", "sharegpt", "prompt_response"),
    "data.on_bad_row": ("skip", "error"),
    "data.non_prefix_stable": ("error", "per_turn"),
    "data.empty_assistant_turns": ("mask", "skip", "keep"),
    "regenerate.turns": ("all", "last"),
    "extract.backend": ("auto", "native", "hooks", "hf"),
    "store.codec": ("blosc-zstd", "zstd", "none"),
    "store.dtype": ("bfloat16", "float8_e4m3", "float8_e5m2"),
    "slurm.executor": ("auto", "slurm", "local"),
    "slurm.container.runtime": ("none", "apptainer", "pyxis"),
    "train.precision": ("bf16", "fp32"),
    "train.optimizer": ("adamw", "muon"),
    "model.dtype": ("bfloat16", "float16", "float32", "auto"),
}


def _get(cfg: RunConfig, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check_values(cfg: RunConfig) -> None:
    for key, allowed in ENUMS.items():
        value = _get(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}.")
    positive = (
        "model.tensor_parallel_size",
        "model.max_model_len",
        "extract.num_tasks",
        "extract.max_num_seqs",
        "extract.max_num_batched_tokens",
        "store.shard_tokens",
        "slurm.max_attempts",
        "data.max_length",
        "regenerate.num_tasks",
        "regenerate.max_tokens",
        "regenerate.batch_conversations",
    )
    for key in positive:
        if _get(cfg, key) <= 0:
            raise ConfigError(f"{key}={_get(cfg, key)} must be > 0.")
    if cfg.store.chunk_tokens < 0:
        raise ConfigError(f"store.chunk_tokens={cfg.store.chunk_tokens} must be > 0, or 0 for about 4 MiB chunks.")
    if cfg.store.chunk_tokens and cfg.store.shard_tokens % cfg.store.chunk_tokens:
        raise ConfigError(
            f"store.shard_tokens={cfg.store.shard_tokens} must be a multiple of "
            f"store.chunk_tokens={cfg.store.chunk_tokens}."
        )
    if cfg.data.max_length >= cfg.model.max_model_len:
        raise ConfigError(
            f"data.max_length={cfg.data.max_length} must be below model.max_model_len="
            f"{cfg.model.max_model_len}: vLLM needs room for the prompt plus the one token it "
            f"generates, so samples can be at most max_model_len - 1 tokens. Set data.max_length="
            f"{cfg.model.max_model_len - 1} or model.max_model_len={cfg.data.max_length + 1}."
        )
    tp, gpus = cfg.model.tensor_parallel_size, cfg.slurm.gpus_per_node * cfg.slurm.nodes
    if cfg.slurm.gpus_per_node > 0 and tp > gpus:
        raise ConfigError(
            f"model.tensor_parallel_size={tp} needs {tp} GPUs per task but slurm.gpus_per_node="
            f"{cfg.slurm.gpus_per_node} x slurm.nodes={cfg.slurm.nodes} gives {gpus}; raise "
            "slurm.gpus_per_node or lower model.tensor_parallel_size."
        )
    if not 0.0 < cfg.extract.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"extract.gpu_memory_utilization={cfg.extract.gpu_memory_utilization} must be in (0, 1].")
    if cfg.slurm.tasks_per_gpu_group < 1:
        raise ConfigError(f"slurm.tasks_per_gpu_group={cfg.slurm.tasks_per_gpu_group} must be >= 1.")
    if cfg.slurm.tasks_per_gpu_group > 1 and not cfg.slurm.share_devices:
        raise ConfigError(
            f"slurm.tasks_per_gpu_group={cfg.slurm.tasks_per_gpu_group} runs tasks side by side on one GPU group, "
            "which only slurm.share_devices=true allows (each engine then keeps to its gpu_memory_utilization "
            "share); set slurm.share_devices=true, or slurm.tasks_per_gpu_group=1."
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
    tok = Path(cfg.model.tokenizer or cfg.model.path)
    if not any((tok / f).is_file() for f in TOKENIZER_FILES):
        key = "model.tokenizer" if cfg.model.tokenizer else "model.path"
        raise ConfigError(
            f"{key}={tok}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); set "
            "model.tokenizer to the folder that has them."
        )
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
    """Refuse a run directory that already belongs to a run with a different data config."""
    existing = Path(cfg.run_dir) / RESOLVED_NAME
    if not existing.is_file() or force:
        return
    try:
        theirs = config_hash(load_config(existing))
    except ConfigError:
        theirs = "unreadable"
    ours = config_hash(cfg)
    if theirs != ours:
        raise ConfigError(
            f"run_dir={cfg.run_dir} already holds another run (its {RESOLVED_NAME} has data-config "
            f"hash {theirs}, this config {ours}); choose a new run_dir, or pass --force to reuse it."
        )


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

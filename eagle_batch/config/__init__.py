"""Configuration: dataclass schema + omegaconf loading. See schema.py for every key."""

from .load import (
    ConfigError,
    config_dict,
    config_hash,
    dotted_leaves,
    load_config,
    load_run_config,
    save_config,
    to_yaml,
)
from .model_info import ModelInfo, default_layer_ids, model_info, resolve_layer_ids, tokenizer_sha256
from .schema import (
    ContainerConfig,
    DataConfig,
    ExtractConfig,
    ModelConfig,
    RunConfig,
    SlurmConfig,
    StoreConfig,
    TrainConfig,
)
from .validate import (
    check_config,
    check_fits_model,
    check_model_files,
    check_prepared_fits,
    check_tokenizer,
    check_values,
    claim_run_dir,
)

__all__ = [
    "ConfigError",
    "check_config",
    "check_fits_model",
    "check_model_files",
    "check_prepared_fits",
    "check_tokenizer",
    "check_values",
    "claim_run_dir",
    "ContainerConfig",
    "DataConfig",
    "ExtractConfig",
    "ModelConfig",
    "ModelInfo",
    "RunConfig",
    "SlurmConfig",
    "StoreConfig",
    "TrainConfig",
    "config_dict",
    "config_hash",
    "default_layer_ids",
    "dotted_leaves",
    "load_config",
    "load_run_config",
    "model_info",
    "resolve_layer_ids",
    "save_config",
    "to_yaml",
    "tokenizer_sha256",
]

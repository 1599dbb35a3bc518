"""Reference backend: transformers forward, one sample at a time (no padding to get wrong).

Layer ids follow `layers.py`: id k < N is `outputs.hidden_states[k]`; id N is taken with a forward hook
on the last decoder layer because transformers' `hidden_states[N]` is after the final norm.

Vision-language wrappers are compared through their language model alone (`TEXT_BACKBONES`, keyed by the
architecture in config.json): the capture is text-only, and transformers may not run the wrapper itself
(Kimi-K2.5 needs remote code for it) while it runs the text model natively.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle_batch.config import RunConfig, model_info, resolve_layer_ids
from eagle_batch.config.remote_code import engine_remote_code

from .layers import hf_hidden_state_source, validate_layer_ids
from .sink import CapturedRequest, Sink

log = logging.getLogger(__name__)


def _decoder_layers(model):
    for path in ("model.layers", "model.language_model.layers", "language_model.model.layers", "model.model.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    raise RuntimeError(f"cannot find decoder layers of {type(model).__name__}")


@dataclass(frozen=True)
class TextBackbone:
    config_key: str  # where config.json keeps the language model's config
    weight_prefix: str  # prefix of the language model's weights in the checkpoint
    model_types: dict[str, str] = field(default_factory=dict)  # text model_type -> transformers' name for it


# The one place that says how to build the transformers reference of a wrapper, by architecture name.
TEXT_BACKBONES: dict[str, TextBackbone] = {
    # Kimi-K2.5 (moonshotai/Kimi-K2.5): a DeepSeek-V3 text model under `language_model.` (weight names of
    # the real checkpoint: language_model.model.layers.N..., language_model.lm_head.weight); the hub's
    # text_config says model_type deepseek_v3 (Kimi-K2's own checkpoints say kimi_k2, the same model).
    "KimiK25ForConditionalGeneration": TextBackbone("text_config", "language_model.", {"kimi_k2": "deepseek_v3"}),
}


def text_backbone_of(path: str | os.PathLike) -> tuple[TextBackbone, dict] | None:
    """(TEXT_BACKBONES entry, the text model's config dict) when config.json names a known wrapper."""
    raw = json.loads((Path(path) / "config.json").read_text())
    spec = TEXT_BACKBONES.get((raw.get("architectures") or [""])[0])
    if spec is None:
        return None
    tc = raw.get(spec.config_key)
    if not isinstance(tc, dict):
        raise RuntimeError(f"{path}/config.json: {raw['architectures'][0]} without a `{spec.config_key}` dict")
    return spec, tc


def text_backbone_config(spec: TextBackbone, text_config: dict):
    """The transformers config of the wrapper's language model."""
    from transformers import AutoConfig

    d = dict(text_config)
    d.pop("auto_map", None)  # the hub's remote-code pointers; transformers runs these models natively
    mt = str(d.pop("model_type", ""))
    return AutoConfig.for_model(spec.model_types.get(mt, mt), **d)


def _write_dequantized(path: str | os.PathLike, dest: str | os.PathLike, dtype) -> None:
    """A copy of the checkpoint's weights with INT4 expert triplets replaced by dequantized `.weight`s, for
    transformers, which has no loader for compressed-tensors experts in its fused MoE layout. Holds every
    tensor in memory: for tiny and small checkpoints, not for the real 600 GB one."""
    from safetensors.torch import load_file, save_file

    from eagle_batch.models.int4 import dequantize_experts

    state: dict[str, torch.Tensor] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        state.update(load_file(str(f)))
    save_file(dequantize_experts(state, dtype), str(Path(dest) / "model.safetensors"), metadata={"format": "pt"})
    gen = Path(path) / "generation_config.json"  # transformers 5.19 fails on a folder without one
    (Path(dest) / gen.name).write_text(gen.read_text() if gen.is_file() else "{}\n")


def load_hf_model(path: str, dtype: str = "float32", device: str | None = None, trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    kw: dict[str, Any] = dict(dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
    backbone = text_backbone_of(path)
    if backbone is None:
        model = AutoModelForCausalLM.from_pretrained(path, **kw)
        return model.to(device).eval()
    spec, tc = backbone
    from eagle_batch.models import int4

    packed = int4.is_pack_quantized(tc)
    if packed:  # INT4 experts: the reference runs the dequantized weights (q * scale), see _write_dequantized
        tc = {k: v for k, v in tc.items() if k != "quantization_config"}
    kw.update(
        config=text_backbone_config(spec, tc),
        key_mapping={"^" + re.escape(spec.weight_prefix): ""},
        trust_remote_code=False,
        output_loading_info=True,
    )
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists every vision weight as unexpected
    try:
        with contextlib.ExitStack() as stack:
            src = path
            if packed:
                src = stack.enter_context(tempfile.TemporaryDirectory(prefix="eagle-batch-dequant-"))
                _write_dequantized(path, src, kw["dtype"])
            model, info = AutoModelForCausalLM.from_pretrained(src, **kw)
    finally:
        hf_logging.set_verbosity(level)
    # A wrong prefix would leave the text model randomly initialised: refuse rather than compare noise.
    missing = list(info.get("missing_keys") or [])
    stray = [k for k in info.get("unexpected_keys") or [] if k.startswith(spec.weight_prefix)]
    if missing or stray:
        raise RuntimeError(
            f"{path}: the {type(model).__name__} reference did not take the checkpoint's language-model "
            f"weights (missing {missing[:5]}, unexpected {stray[:5]}); check TEXT_BACKBONES in capture/hf.py"
        )
    log.info("%s: transformers reference = its %s (%s*)", path, type(model).__name__, spec.weight_prefix)
    return model.to(device).eval()


@torch.no_grad()
def hf_hidden_states(model, input_ids: Sequence[int], layer_ids: Sequence[int]) -> torch.Tensor:
    """[T, L, H] states of `input_ids` at `layer_ids` (semantics of layers.py), on the model's device."""
    n = int(model.config.get_text_config().num_hidden_layers)
    layer_ids = validate_layer_ids(layer_ids, n)
    layers = _decoder_layers(model)
    captured: dict[str, torch.Tensor] = {}

    def hook(_mod, _inp, out):
        captured["last"] = out[0] if isinstance(out, tuple) else out

    need_hook = any(hf_hidden_state_source(i, n)[0] == "last_layer_hook" for i in layer_ids)
    handle = layers[n - 1].register_forward_hook(hook) if need_hook else None
    try:
        dev = next(model.parameters()).device
        ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64), device=dev)[None]
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False, logits_to_keep=1)
    finally:
        if handle is not None:
            handle.remove()
    rows = []
    for i in layer_ids:
        src, k = hf_hidden_state_source(i, n)
        rows.append(captured["last"][0] if src == "last_layer_hook" else out.hidden_states[k][0])
    return torch.stack(rows, dim=1)


class HFBackend:
    name = "hf"

    def __init__(self, cfg: RunConfig, layer_ids: list[int] | None = None, device: str | None = None):
        self.cfg = cfg
        self.info = model_info(cfg.model.path)
        self.layer_ids = list(layer_ids) if layer_ids is not None else resolve_layer_ids(cfg.model, self.info)
        self.hidden_size = self.info.hidden_size
        self.model = load_hf_model(cfg.model.path, cfg.model.dtype, device, engine_remote_code(cfg.model))

    def run_batch(self, samples: Sequence[Any], sink: Sink) -> None:
        for s in samples:
            states = hf_hidden_states(self.model, s.input_ids, self.layer_ids).cpu()
            sink.put(CapturedRequest(s.sample_id, "hf", np.asarray(s.input_ids, dtype=np.int64), states, None))

    def close(self) -> None:
        self.model = None

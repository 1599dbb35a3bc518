"""Reference backend: transformers forward, one sample at a time (no padding to get wrong).

Layer ids follow `layers.py`: id k < N is `outputs.hidden_states[k]`; id N is taken with a forward hook
on the last decoder layer because transformers' `hidden_states[N]` is after the final norm.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from eagle_batch.config import RunConfig, model_info, resolve_layer_ids

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


def load_hf_model(path: str, dtype: str = "float32", device: str | None = None, trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
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
        self.model = load_hf_model(cfg.model.path, cfg.model.dtype, device, cfg.model.trust_remote_code)

    def run_batch(self, samples: Sequence[Any], sink: Sink) -> None:
        for s in samples:
            states = hf_hidden_states(self.model, s.input_ids, self.layer_ids).cpu()
            sink.put(CapturedRequest(s.sample_id, "hf", np.asarray(s.input_ids, dtype=np.int64), states, None))

    def close(self) -> None:
        self.model = None

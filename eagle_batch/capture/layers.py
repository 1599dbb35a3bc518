"""Layer-id semantics, in one place.

A decoder-only model with N decoder layers has N+1 points on its residual stream:

- id 0      : the token embeddings (input of decoder layer 0);
- id k      : the residual stream after k decoder layers (output of decoder layer k-1), 1 <= k < N;
- id N      : the output of the last decoder layer, BEFORE the final norm.

This is what vLLM's `extract_hidden_states` method and EAGLE-3 call "aux hidden state layer ids", and it
equals transformers' `output_hidden_states[k]` for every k < N. For k == N transformers returns the state
AFTER the final norm (same direction per token, different scale), so the reference backend takes id N
with a forward hook on the last decoder layer instead (`hf_hidden_state_source`).

vLLM decoder layers return `(hidden_states, residual)` with the residual add deferred to the next
layer's fused add-norm; the residual stream is their sum (`residual_stream`). The `hooks` backend uses
this; the `native` backend gets the sum from vLLM itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from eagle_batch.config.model_info import check_layer_ids


def validate_layer_ids(layer_ids: Sequence[int], num_hidden_layers: int) -> list[int]:
    """Return layer_ids as a list, raising ValueError (ConfigError) naming the bad ids."""
    return check_layer_ids([int(i) for i in layer_ids], num_hidden_layers)


def hf_hidden_state_source(layer_id: int, num_hidden_layers: int) -> tuple[str, int]:
    """Where the transformers reference reads id `layer_id`.

    Returns ("hidden_states", k) to read `outputs.hidden_states[k]`, or ("last_layer_hook", N-1) to read
    the raw output of decoder layer N-1 (before the final norm) through a forward hook.
    """
    if not 0 <= layer_id <= num_hidden_layers:
        raise ValueError(f"layer id {layer_id} outside 0..{num_hidden_layers}")
    if layer_id == num_hidden_layers:
        return "last_layer_hook", num_hidden_layers - 1
    return "hidden_states", layer_id


def vllm_layer_output_index(layer_id: int) -> int | None:
    """Which vLLM decoder layer's output (hidden + residual) holds id `layer_id`.

    id k (k >= 1) is the output of decoder layer k-1. id 0 is the embedding output, which no decoder
    layer returns: the hooks backend reads it as the input of decoder layer 0 (returns None here).
    """
    if layer_id < 0:
        raise ValueError(f"negative layer id {layer_id}")
    return None if layer_id == 0 else layer_id - 1


def residual_stream(layer_output):
    """The residual stream from a vLLM decoder layer's return value.

    vLLM layers return `(hidden_states, residual)` where the true stream is hidden + residual (the add is
    fused into the next layer's norm); some return a single tensor or `(hidden, None)`.
    """
    if isinstance(layer_output, tuple):
        h = layer_output[0]
        r = layer_output[1] if len(layer_output) > 1 else None
        return h if r is None else h + r
    return layer_output

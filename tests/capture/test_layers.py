"""Layer-id semantics (layers.py) and the transformers reference that follows them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eagle_batch.capture.layers import (
    hf_hidden_state_source,
    residual_stream,
    validate_layer_ids,
    vllm_layer_output_index,
)


def test_validate_layer_ids_names_bad_ids():
    assert validate_layer_ids([2, 3, 6], 6) == [2, 3, 6]
    with pytest.raises(ValueError, match=r"\[7\].*outside 0..6"):
        validate_layer_ids([2, 7], 6)
    with pytest.raises(ValueError, match="repeats"):
        validate_layer_ids([2, 2], 6)
    with pytest.raises(ValueError, match="empty"):
        validate_layer_ids([], 6)


def test_sources_and_vllm_indices():
    assert hf_hidden_state_source(0, 6) == ("hidden_states", 0)
    assert hf_hidden_state_source(3, 6) == ("hidden_states", 3)
    assert hf_hidden_state_source(6, 6) == ("last_layer_hook", 5)
    assert vllm_layer_output_index(0) is None
    assert vllm_layer_output_index(1) == 0 and vllm_layer_output_index(6) == 5


def test_residual_stream_sums_vllm_layer_outputs():
    h, r = torch.ones(2, 3), torch.full((2, 3), 2.0)
    assert torch.equal(residual_stream((h, r)), torch.full((2, 3), 3.0))
    assert torch.equal(residual_stream((h, None)), h)
    assert torch.equal(residual_stream(h), h)


def test_hf_reference_id_n_is_before_final_norm(tiny_model):
    """id k<N equals transformers' hidden_states[k]; id N is the pre-norm output and norm(id N) equals
    transformers' hidden_states[N] (which is after the final norm)."""
    from eagle_batch.capture.hf import hf_hidden_states, load_hf_model

    path = tiny_model("llama")
    model = load_hf_model(str(path), "float32", "cpu")
    ids = np.arange(100, 140)
    n = model.config.num_hidden_layers
    st = hf_hidden_states(model, ids, [0, 2, n])
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids)[None], output_hidden_states=True)
    assert st.shape == (40, 3, model.config.hidden_size)
    assert torch.equal(st[:, 0], out.hidden_states[0][0])
    assert torch.equal(st[:, 1], out.hidden_states[2][0])
    assert not torch.allclose(st[:, 2], out.hidden_states[n][0], atol=1e-3)  # transformers' [N] is post-norm
    torch.testing.assert_close(model.model.norm(st[:, 2]), out.hidden_states[n][0], rtol=1e-5, atol=1e-5)

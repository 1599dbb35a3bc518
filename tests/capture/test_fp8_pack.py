"""The connector's device-side float8 quantization (capture/fp8.py) against the store's, and the writer thread
handing packed rows to a float8 store (no vLLM needed: torch on the CPU runs the same code as on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eagle_batch.capture import fp8
from eagle_batch.capture.sink import CapturedRequest
from eagle_batch.capture.writer import CaptureError, WriterThread
from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec, TaskStoreWriter, open_dataset
from eagle_batch.store.fp8 import E4M3, E5M2, dequantize, quantize

L, H = 3, 40


def _bf16(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, L, H, generator=g) * torch.logspace(-3, 2, H)  # outlier channels, tiny ones too
    x[0, 1] = 0  # a row of zeros
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("f8", [E4M3, E5M2], ids=lambda f: f.dtype)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_pack_gives_the_store_quantization_bit_for_bit(monkeypatch, device, f8):
    monkeypatch.setattr(fp8, "PASS_TOKENS", 7)  # several passes, the last one partial
    rows = _bf16(30, 1)
    packed = fp8.pack(rows.to(device), f8).cpu()
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (30, fp8.packed_row_nbytes(L, H))
    got = fp8.unpack(packed.numpy(), L, H)
    want = quantize(rows.view(torch.uint16).numpy(), f8)
    np.testing.assert_array_equal(got.codes, want.codes)
    np.testing.assert_array_equal(got.scales, want.scales)
    with pytest.raises(ValueError, match="expected \\[tokens, 132\\]"):
        fp8.unpack(packed.numpy()[:, :-1], L, H)


@pytest.mark.parametrize("f8", [E4M3, E5M2], ids=lambda f: f.dtype)
def test_writer_thread_appends_packed_rows_to_a_float8_store(tmp_path, samples_factory, f8):
    spec = StoreSpec(layer_ids=[1, 2, 3], hidden_size=H, model_name="m", dtype=f8.dtype)
    samples = samples_factory([5, 9, 4])
    states = [_bf16(len(s.input_ids), i) for i, s in enumerate(samples)]
    with TaskStoreWriter.open(tmp_path / "s.zarr", spec, StoreConfig(chunk_tokens=4, shard_tokens=8)) as w:
        wt = WriterThread(w, L, H)
        wt.expect(samples)
        released = []
        for i, (s, st) in enumerate(zip(samples, states)):
            item = CapturedRequest(s.sample_id, f"r{i}", s.input_ids, torch.from_numpy(fp8.pack(st, f8).numpy()))
            item.release = lambda i=i: released.append(i)
            wt.put(item)
        wt.commit(wait=True)
        wt.close()
    assert sorted(released) == [0, 1, 2]
    ds = open_dataset(tmp_path / "s.zarr")
    for i, st in enumerate(states):
        q = quantize(st.view(torch.uint16).numpy(), f8)
        np.testing.assert_array_equal(ds.get_arrays(i)["hidden_states"], dequantize(q.codes, q.scales, f8))


def test_writer_thread_names_a_sample_whose_float8_scale_is_not_finite(fake_writer_cls, samples_factory):
    samples = samples_factory([6])
    st = _bf16(6, 3)
    st[4, 2, 7] = float("inf")
    wt = WriterThread(fake_writer_cls(), L, H)
    wt.expect(samples)
    wt.put(CapturedRequest(samples[0].sample_id, "r", samples[0].input_ids, fp8.pack(st, E4M3)))
    with pytest.raises(
        CaptureError, match=f"sample {samples[0].sample_id}: .*NaN/Inf \\(first at token 4, layer index 2\\)"
    ):
        wt.commit(wait=True)
    with pytest.raises(CaptureError):
        wt.close()

"""store.dtype float8_e4m3 / float8_e5m2: quantization, the writer and reader, verify, plain zarr + numpy,
mismatches. Every store test runs for both encodings (the `f8` fixture)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from store_testlib import HIDDEN, LAYERS, make_sample

from eagle_batch.config import StoreConfig
from eagle_batch.store import (
    StoreError,
    StoreMismatchError,
    StoreSpec,
    TaskStoreWriter,
    aggregate,
    open_dataset,
    read_record,
    verify,
)
from eagle_batch.store.fp8 import E4M3, E5M2, Float8, Fp8Rows, bf16_to_f32, dequantize, dequantize_f32, quantize


@pytest.fixture(params=[E4M3, E5M2], ids=lambda f: f.dtype)
def f8(request) -> Float8:
    return request.param


@pytest.fixture
def fp8_spec(spec, f8) -> StoreSpec:
    return dataclasses.replace(spec, dtype=f8.dtype)


def write(path, spec, cfg, samples, commit_every=4, lend=False):
    with TaskStoreWriter.open(path, spec, cfg) as w:
        for i, s in enumerate(samples):
            w.append(*s, on_release=(lambda: None) if lend else None)
            if (i + 1) % commit_every == 0:
                w.commit()
        w.finalize()
    return read_record(path)


@pytest.mark.parametrize(
    "f8, top_code, smallest_normal, mantissa_bits", [(E4M3, 0x7E, 2.0**-6, 3), (E5M2, 0x7B, 2.0**-14, 2)]
)
def test_quantize_row_scale_error_bound_and_zero_rows(f8, top_code, smallest_normal, mantissa_bits):
    assert (f8.smallest_normal, f8.mantissa_bits) == (smallest_normal, mantissa_bits)
    _, _, _, bits = make_sample(3)
    bits[0, 1] = 0  # a row of zeros
    q = quantize(bits, f8)
    x = bf16_to_f32(bits)
    amax = np.abs(x).max(-1)
    np.testing.assert_array_equal(q.scales, amax / np.float32(f8.max))
    assert q.scales[0, 1] == 0 and not q.codes[0, 1].any()
    # Each row's largest magnitude is the encoding's largest finite value (448: 0x7E; 57344: 0x7B; | 0x80 when
    # negative); no NaN or Inf code.
    top = np.take_along_axis(q.codes, np.abs(x).argmax(-1)[..., None], -1)[..., 0]
    assert set(np.unique(top[amax > 0] & 0x7F)) == {top_code}
    assert np.isfinite(f8.values[q.codes]).all()
    # Values in the normal range come back within half an ulp of m mantissa bits: 2^-(m+1) relative.
    d = dequantize_f32(q.codes, q.scales, f8)
    normal = np.abs(x) >= amax[..., None] * smallest_normal / f8.max
    assert (np.abs(d - x)[normal] <= 2.0 ** -(mantissa_bits + 1) * np.abs(x)[normal]).all()
    # The reader's bf16 is that float32 rounded to nearest even.
    import ml_dtypes

    np.testing.assert_array_equal(dequantize(q.codes, q.scales, f8), d.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_roundtrip_raw_codes_verify_and_format_version(tmp_path, fp8_spec, f8, small_cfg):
    samples = [make_sample(i) for i in range(14)]
    rec = write(tmp_path / "s.zarr", fp8_spec, small_cfg, samples)
    assert rec["format_version"] == 2 and set(rec["shards"]) == {
        "hidden_states",
        "hidden_states_scale",
        "input_ids",
        "loss_mask",
    }
    attrs = json.loads((tmp_path / "s.zarr" / "zarr.json").read_text())["attributes"]["eagle_batch"]
    assert attrs["dtype"] == f8.dtype and attrs["format_version"] == 2
    meta = json.loads((tmp_path / "s.zarr" / "hidden_states" / "zarr.json").read_text())
    assert meta["attributes"]["eagle_batch"]["encoding"] == f8.encoding
    ds = open_dataset(tmp_path / "s.zarr")
    for i, s in enumerate(samples):
        q = quantize(s[3], f8)
        x = ds.get_arrays(i)
        np.testing.assert_array_equal(x["hidden_states"], dequantize(q.codes, q.scales, f8))
        r = ds.get_arrays(i, raw=True)
        np.testing.assert_array_equal(r["hidden_states"], q.codes)
        np.testing.assert_array_equal(r["hidden_states_scale"], q.scales)
    t = ds.get(2, raw=True)
    assert str(t["hidden_states"].dtype) == f"torch.{f8.encoding}" and tuple(t["hidden_states_scale"].shape) == (
        len(samples[2][1]),
        len(LAYERS),
    )
    assert str(ds[2]["hidden_states"].dtype) == "torch.bfloat16"
    # Some layers only: codes and scales are cut the same way.
    sub = open_dataset(tmp_path / "s.zarr", layer_ids=[LAYERS[2], LAYERS[0]])
    q = quantize(samples[5][3], f8)
    np.testing.assert_array_equal(sub.get_arrays(5)["hidden_states"], dequantize(q.codes, q.scales, f8)[:, [2, 0]])
    assert verify(tmp_path / "s.zarr") == []


def test_plain_zarr_and_numpy_dequantize_like_the_reader(tmp_path, fp8_spec, f8, small_cfg):
    """docs/reference/store-format.md, "FP8 hidden states": its block, run where eagle-batch cannot be imported, reads sample 3
    of a float8 store as the reader's float32 dequantization, with a code table equal to ml_dtypes'."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "store-format.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", doc.split("\n## FP8 hidden states")[1], flags=re.S)
    samples = [make_sample(i) for i in range(6)]
    write(tmp_path / "task-00000.zarr", fp8_spec, small_cfg, samples)
    driver = block + "\nimport sys\nnp.save('states.npy', states)\nnp.save('table.npy', table)\n"
    driver += "assert not [m for m in sys.modules if m.startswith('eagle_batch')]\n"
    r = subprocess.run([sys.executable, "-I", "-c", driver], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "table.npy").astype(np.float32), f8.values)
    x = open_dataset(tmp_path / "task-00000.zarr").get_arrays(3, raw=True)
    want = dequantize_f32(x["hidden_states"], x["hidden_states_scale"], f8)
    np.testing.assert_array_equal(np.load(tmp_path / "states.npy"), want)


def test_prequantized_rows_give_the_same_store_as_bf16(tmp_path, fp8_spec, f8, small_cfg):
    """What the capture hands over (codes and scales from the device, lent) equals quantizing in the writer."""
    samples = [make_sample(i) for i in range(10)]
    a = write(tmp_path / "a.zarr", fp8_spec, small_cfg, samples)
    pre = [(sid, ids, mask, quantize(hs, f8)) for sid, ids, mask, hs in samples]
    b = write(tmp_path / "b.zarr", fp8_spec, small_cfg, pre, lend=True)
    for name in a["shards"]:
        assert [x["crc32c"] for x in a["shards"][name]] == [x["crc32c"] for x in b["shards"][name]], name
    # Codes that are not contiguous (a packed capture record) are copied, with the same result.
    packed = [
        (sid, ids, mask, Fp8Rows(np.pad(q.codes, ((0, 0), (0, 0), (0, 5)))[..., :HIDDEN], q.scales))
        for sid, ids, mask, q in pre
    ]
    c = write(tmp_path / "c.zarr", fp8_spec, small_cfg, packed, lend=True)
    assert [x["crc32c"] for x in c["shards"]["hidden_states"]] == [x["crc32c"] for x in a["shards"]["hidden_states"]]


def test_refusals_name_the_cause(tmp_path, spec, fp8_spec, f8, small_cfg):
    sid, ids, mask, hs = make_sample(1)
    with TaskStoreWriter.open(tmp_path / "f.zarr", fp8_spec, small_cfg) as w:
        bad = hs.copy()
        bad[0, 0, 0] = 0x7FC0  # bf16 NaN
        with pytest.raises(ValueError, match="NaN/Inf.*float8"):
            w.append(sid, ids, mask, bad)
        w.append(sid, ids, mask, hs)
        w.commit()
    with TaskStoreWriter.open(tmp_path / "b.zarr", spec, small_cfg) as w:
        with pytest.raises(TypeError, match="store.dtype"):
            w.append(sid, ids, mask, quantize(hs, f8))
    # Resuming a float8 store as bfloat16 (or the reverse) names the dtype.
    with pytest.raises(StoreMismatchError, match="dtype"):
        TaskStoreWriter.open(tmp_path / "f.zarr", spec, small_cfg)
    with pytest.raises(ValueError, match="store.dtype"):
        StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN, dtype="float8")


def test_newer_format_version_is_refused(tmp_path, fp8_spec, small_cfg):
    write(tmp_path / "s.zarr", fp8_spec, small_cfg, [make_sample(0)])
    p = tmp_path / "s.zarr" / "zarr.json"
    meta = json.loads(p.read_text())
    meta["attributes"]["eagle_batch"]["format_version"] = 99
    p.write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="format_version 99.*upgrade"):
        len(open_dataset(tmp_path / "s.zarr"))


def test_verify_finds_nan_codes_and_bad_scales(tmp_path, fp8_spec, f8, small_cfg):
    sid, ids, mask, hs = make_sample(2)
    q = quantize(hs, f8)
    codes, scales = q.codes.copy(), q.scales.copy()
    codes[0, 0, 0] = 0x7F  # NaN in both encodings
    scales[1, 0] = -1.0
    with TaskStoreWriter.open(tmp_path / "s.zarr", fp8_spec, small_cfg) as w:
        w.append(sid, ids, mask, Fp8Rows(codes, scales))
        w.commit()
    got = {(p.array, p.kind) for p in verify(tmp_path / "s.zarr")}
    assert got == {("hidden_states", "values"), ("hidden_states_scale", "values")}


def test_aggregated_fp8_run_reads_bf16(tmp_path, fp8_spec, f8):
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, fsync=False)
    samples = []
    for s in range(2):
        chunk = [make_sample(100 * s + i, max_len=20) for i in range(3)]
        write(tmp_path / "stores" / f"task-{s:05d}.zarr", fp8_spec, cfg, chunk)
        samples += chunk
    index = aggregate(tmp_path)
    assert set(index["arrays"]) == {"hidden_states", "hidden_states_scale", "input_ids", "loss_mask"}
    ds = open_dataset(tmp_path)
    for i, s in enumerate(samples):
        q = quantize(s[3], f8)
        np.testing.assert_array_equal(ds.get_arrays(i)["hidden_states"], dequantize(q.codes, q.scales, f8))
    assert verify(tmp_path) == []


def test_trainer_reads_a_float8_store_as_bf16(tmp_path, fp8_spec, f8, small_cfg):
    import torch

    from eagle_batch.train.data import TrainSamples

    samples = [make_sample(i) for i in range(4)]
    write(tmp_path / "s.zarr", fp8_spec, small_cfg, samples)
    ts = TrainSamples(open_dataset(tmp_path / "s.zarr"), LAYERS[:2], LAYERS[2])
    q = quantize(samples[1][3], f8)
    want = torch.from_numpy(dequantize(q.codes, q.scales, f8)).view(torch.bfloat16)
    x = ts[1]
    assert x["aux"].dtype == torch.bfloat16
    assert torch.equal(x["aux"], want[:, :2].reshape(len(want), -1)) and torch.equal(x["last"], want[:, 2])


def test_bench_error_metrics_bound_what_each_encoding_can_hold(f8):
    """bench store's fp8_error: per layer; in the normal range within 2^-(m+1) (+ bf16's rounding of it)."""
    from eagle_batch.bench.fp8_error import METRICS, layer_errors

    bits = np.concatenate([make_sample(i)[3] for i in range(8)])
    got = layer_errors(bits, LAYERS, f8)
    assert got["layer_ids"] == LAYERS and all(len(got[m]) == len(LAYERS) for m in METRICS)
    assert all(0.995 < c <= 1.0 for c in got["cosine_min"])
    assert all(e <= 2.0 ** -(f8.mantissa_bits + 1) * (1 + 2.0**-7) for e in got["max_rel_err_normal"])
    assert all(0 < e < 0.025 * 2 ** (3 - f8.mantissa_bits) for e in got["rel_l2_mean"])


def test_e5m2_codes_are_fewer_bytes_than_e4m3(tmp_path, spec, small_cfg):
    """The point of E5M2: one mantissa bit less per code, which the store's entropy coder turns into fewer
    bytes for the same states."""
    samples = [make_sample(i, max_len=200) for i in range(24)]
    sizes = {}
    for f in (E4M3, E5M2):
        store = tmp_path / f"{f.dtype}.zarr"
        write(store, dataclasses.replace(spec, dtype=f.dtype), small_cfg, samples)
        sizes[f.dtype] = sum(p.stat().st_size for p in (store / "hidden_states").rglob("*") if p.is_file())
    assert sizes["float8_e5m2"] < 0.95 * sizes["float8_e4m3"], sizes

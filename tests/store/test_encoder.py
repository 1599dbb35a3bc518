"""ChunkEncoder: numcodecs' C compressors called into our own buffers must give numcodecs' exact bytes, and
the store must fall back to numcodecs where they cannot be called. (The entropy-only blosc frames are
tested in test_blosc_frame.py.)"""

import numpy as np
import pytest

from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec, TaskStoreWriter, open_dataset, verify
from eagle_batch.store import encoder as enc_mod
from eagle_batch.store.encoder import ChunkEncoder
from eagle_batch.store.format import Codec, make_decoder
from eagle_batch.store.ingest import Ingest

CODECS = [Codec("blosc-zstd", 1), Codec("blosc-zstd", 5, 1 << 16), Codec("zstd", 1), Codec("zstd", 7), Codec("none")]


def _bf16_like(rng, shape):
    # bf16 bit patterns of normal floats: exponent bytes compress, mantissa bytes do not
    return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.name}-{c.level}")
@pytest.mark.parametrize("dtype", ["u1", "<u2", "<i4"])
def test_direct_output_is_numcodecs_output(codec, dtype):
    rng = np.random.default_rng(0)
    chunk = _bf16_like(rng, (64, 4, 96)).astype(dtype) if dtype != "u1" else rng.integers(0, 2, 5000, np.uint8)
    e = ChunkEncoder(codec, np.dtype(dtype).itemsize)
    assert e.direct, e.why_not_direct
    out = np.full(e.bound(chunk.nbytes), 0xAB, np.uint8)
    got = e.encode(chunk, out)
    assert isinstance(got, memoryview) and np.shares_memory(np.frombuffer(got, np.uint8), out)
    want = chunk.tobytes() if codec.name == "none" else bytes(codec.numcodec().encode(chunk))
    assert bytes(got) == want
    assert bytes(make_decoder(codec)(bytes(got))) == chunk.tobytes()
    # a reused buffer holding an older, longer result gives only the new bytes
    small = chunk[: len(chunk) // 3].copy()
    again = e.encode(small, out)
    assert bytes(again) == (small.tobytes() if codec.name == "none" else bytes(codec.numcodec().encode(small)))


def test_incompressible_chunk_fits_the_bound():
    rng = np.random.default_rng(1)
    chunk = rng.integers(0, 1 << 16, (256, 4, 64), dtype=np.uint16)
    for codec in CODECS:
        e = ChunkEncoder(codec, 2)
        out = np.empty(e.bound(chunk.nbytes), np.uint8)
        got = e.encode(chunk, out)
        assert bytes(make_decoder(codec)(bytes(got))) == chunk.tobytes()


def test_non_contiguous_chunk_is_encoded_as_its_rows():
    rng = np.random.default_rng(2)
    full = _bf16_like(rng, (32, 8, 64))
    view = full[:, ::2]  # not contiguous
    e = ChunkEncoder(Codec("blosc-zstd", 1), 2)
    got = e.encode(view, np.empty(e.bound(view.nbytes), np.uint8))
    assert bytes(got) == bytes(Codec("blosc-zstd", 1).numcodec().encode(np.ascontiguousarray(view)))


def test_falls_back_to_numcodecs_when_the_symbol_is_missing(monkeypatch, tmp_path):
    def missing():
        raise AttributeError("undefined symbol: blosc_compress_ctx")

    monkeypatch.setattr(enc_mod, "_blosc_fn", missing)
    e = ChunkEncoder(Codec("blosc-zstd", 1), 2)
    assert not e.direct and "blosc_compress_ctx" in e.why_not_direct
    chunk = _bf16_like(np.random.default_rng(3), (16, 4, 32))
    got = e.encode(chunk, np.empty(e.bound(chunk.nbytes), np.uint8))
    assert isinstance(got, bytes) and got == bytes(Codec("blosc-zstd", 1).numcodec().encode(chunk))
    # the store still writes a bit-exact, verifiable store through the fallback
    _write_and_check(tmp_path / "s.zarr", expect_direct=False, entropy_only=False)


@pytest.mark.parametrize("entropy_only", [True, False])
def test_store_reuses_encoded_chunk_buffers_and_reads_back(tmp_path, entropy_only):
    _write_and_check(tmp_path / "s.zarr", expect_direct=True, entropy_only=entropy_only)


def test_uncompressed_store_checksums_verify(tmp_path):
    # codec none takes one crc32c pass per chunk for both the rows and the encoded bytes
    _write_and_check(tmp_path / "s.zarr", expect_direct=True, entropy_only=False, codec="none")


def _write_and_check(path, expect_direct, entropy_only, codec="blosc-zstd"):
    L, H = 2, 64
    spec = StoreSpec(layer_ids=[1, 2], hidden_size=H, model_name="t")
    cfg = StoreConfig(
        chunk_tokens=16, shard_tokens=64, fsync=False, adaptive=False, entropy_only=entropy_only, codec=codec
    )
    rng = np.random.default_rng(4)
    samples = []
    with TaskStoreWriter.open(path, spec, cfg) as w:
        st = w._ingest.streams["hidden_states"]
        assert st.encoder.direct is expect_direct
        assert st.encoder.entropy_only is entropy_only, st.encoder.why_not_entropy
        assert w.encoder_info()["entropy_only"] is entropy_only
        for i in range(40):
            t = int(rng.integers(1, 90))
            hs = _bf16_like(rng, (t, L, H))
            ids = rng.integers(0, 1000, t)
            samples.append((f"s{i}", hs, ids))
            w.append(f"s{i}", ids, np.ones(t, np.uint8), hs)
            if i % 7 == 6:
                w.commit()
        w.finalize()
        if expect_direct:
            # ~25 full shards of 4 chunks each went through a bounded set of reused buffers
            assert 0 < len(st.out_free) <= (Ingest.IO_QUEUE_CAP + 2) * 4 + 2 * w.encode_threads + 2
    ds = open_dataset(path)
    assert len(ds) == len(samples)
    for i, (sid, hs, ids) in enumerate(samples):
        x = ds.get_arrays(i)
        assert x["sample_id"] == sid
        assert np.array_equal(x["hidden_states"], hs) and np.array_equal(x["input_ids"], ids)
    assert verify(path, True) == []

"""BloscFrameWriter: its frames are ordinary blosc frames (numcodecs and zarr decode them bit-exactly) that
compress bf16 states as well as c-blosc's zstd level 1, whatever the chunk's size, typesize, blocksize or
content; and the store falls back to c-blosc when the frames do not check out."""

import struct
import threading

import numpy as np
import pytest
from numcodecs import Blosc

from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec, TaskStoreWriter, open_dataset, verify
from eagle_batch.store import encoder as enc_mod
from eagle_batch.store.blosc_frame import FLAG_DONT_SPLIT, FLAG_MEMCPYED, HEADER, OVERHEAD, BloscFrameWriter
from eagle_batch.store.encoder import ChunkEncoder
from eagle_batch.store.format import Codec


def _bf16_like(rng, shape):
    return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _frame(writer, chunk):
    out = np.full(chunk.nbytes + OVERHEAD, 0xCD, np.uint8)
    return bytes(out[: writer.encode(chunk, out)])


def _blocks(frame):
    """(header fields, [(block start, stream size)]) parsed as c-blosc's decoder reads a non-split frame."""
    version, versionlz, flags, typesize, nbytes, blocksize, cbytes = HEADER.unpack_from(frame)
    assert cbytes == len(frame)
    if flags & FLAG_MEMCPYED:
        return (flags, typesize, nbytes, blocksize), []
    n = -(-nbytes // blocksize)
    starts = struct.unpack_from(f"<{n}i", frame, OVERHEAD)
    streams = [(s, struct.unpack_from("<i", frame, s)[0]) for s in starts]
    assert streams[0][0] == OVERHEAD + 4 * n
    for (s, size), nxt in zip(streams, [*starts[1:], len(frame)]):
        assert s + 4 + size == nxt  # streams are back to back and end at the frame's end
    return (flags, typesize, nbytes, blocksize), streams


CASES = [  # (dtype, shape or count, blocksize)
    ("<u2", (64, 4, 96), 1 << 20),  # one block (chunk < blocksize)
    ("<u2", (40, 4, 7168), 1 << 20),  # two full blocks and a leftover block
    ("<u2", (64, 4, 512), 1 << 16),  # many blocks, no leftover
    ("<u2", (3, 1, 5), 1 << 16),  # tiny
    ("<u2", (64, 4, 96), 0),  # c-blosc's automatic blocksize
    ("<u2", (64, 4, 7168), None),  # one block per chunk (the store's choice)
    ("<u2", (1, 1, 50), None),  # too small for c-blosc to compress: memcpyed
    ("u1", 300_001, 1 << 16),
    ("<u4", 100_003, 1 << 18),
    ("<u8", 70_001, 1 << 16),
]


@pytest.mark.parametrize("dtype,shape,blocksize", CASES)
def test_frames_decode_bit_exactly_and_match_c_blosc_headers(dtype, shape, blocksize):
    rng = np.random.default_rng(0)
    chunk = (
        _bf16_like(rng, shape).astype(dtype)
        if dtype == "<u2"
        else (rng.standard_normal(shape) * 40).astype(np.int64).astype(dtype)
    )
    w = BloscFrameWriter(blocksize, chunk.dtype.itemsize)
    frame = _frame(w, chunk)
    assert bytes(Blosc().decode(frame)) == chunk.tobytes()
    ref = bytes(
        Blosc(
            cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=chunk.nbytes if blocksize is None else blocksize
        ).encode(chunk)
    )
    (flags, typesize, nbytes, bs), streams = _blocks(frame)
    assert blocksize is not None or len(streams) <= 1
    assert frame[:2] == ref[:2] and frame[3:12] == ref[3:12]  # versions, typesize, nbytes, blocksize
    if ref[2] & FLAG_MEMCPYED:  # c-blosc did not compress it: neither may we
        assert frame == ref
    else:
        assert flags & ~FLAG_DONT_SPLIT == ref[2] & ~FLAG_DONT_SPLIT and flags & FLAG_DONT_SPLIT
    assert _frame(w, chunk) == frame  # deterministic


def test_ratio_on_bf16_states_is_c_blosc_level_1s():
    chunk = _bf16_like(np.random.default_rng(1), (64, 4, 2048))
    w = BloscFrameWriter(1 << 20, 2)
    ours = len(_frame(w, chunk))
    ref = len(Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=1 << 20).encode(chunk))
    assert ours < 0.75 * chunk.nbytes  # the exponent bytes are entropy-coded
    assert ours <= 1.01 * ref


def test_states_repeated_far_apart_in_a_chunk_are_found():
    # Samples sharing a prefix have identical states there; with several samples per chunk the repeat can lie
    # megabytes back. The frames must find it as c-blosc's zstd-1 does (its window spans the block).
    rng = np.random.default_rng(8)
    chunk = _bf16_like(rng, (512, 4, 576))
    chunk[300:400] = chunk[0:100]  # 1.4 MB apart
    plain = _bf16_like(np.random.default_rng(8), (512, 4, 576))
    w = BloscFrameWriter(None, 2)
    ours, without_repeat = len(_frame(w, chunk)), len(_frame(w, plain))
    ref = len(Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=chunk.nbytes).encode(chunk))
    assert ours < 0.85 * without_repeat  # the 100 repeated rows (20%) cost almost nothing
    assert ours <= ref


def test_incompressible_block_is_stored_inside_a_compressed_frame():
    rng = np.random.default_rng(2)
    noise = rng.integers(0, 1 << 16, 1 << 18, dtype=np.uint16)  # one 512 KiB block of noise
    chunk = np.concatenate([_bf16_like(rng, 1 << 18), noise, _bf16_like(rng, 1 << 17)])
    w = BloscFrameWriter(1 << 19, 2)
    frame = _frame(w, chunk)
    (flags, _, _, bs), streams = _blocks(frame)
    assert not flags & FLAG_MEMCPYED
    assert [size == bs for _, size in streams] == [False, True, False]  # size == block size: stored
    assert bytes(Blosc().decode(frame)) == chunk.tobytes()


def test_incompressible_chunk_is_c_blosc_memcpyed_frame():
    chunk = np.random.default_rng(3).integers(0, 1 << 16, 300_000, dtype=np.uint16)
    frame = _frame(BloscFrameWriter(1 << 16, 2), chunk)
    ref = bytes(Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=1 << 16).encode(chunk))
    assert HEADER.unpack_from(frame)[2] & FLAG_MEMCPYED
    assert frame == ref and len(frame) == chunk.nbytes + OVERHEAD


def test_threads_share_one_writer():
    rng = np.random.default_rng(4)
    chunks = [_bf16_like(rng, (32, 4, 1024)) for _ in range(8)]
    w = BloscFrameWriter(1 << 16, 2)
    want = [_frame(w, c) for c in chunks]
    got = [None] * 32

    def work(i):
        got[i] = _frame(w, chunks[i % 8])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want * 4


def test_store_falls_back_to_c_blosc_when_frames_do_not_decode(monkeypatch, tmp_path):
    class Broken(BloscFrameWriter):
        def encode(self, chunk, out):
            n = super().encode(chunk, out)
            out[n - 1] ^= 0xFF  # a corrupt last byte
            return n

    monkeypatch.setattr(enc_mod, "BloscFrameWriter", Broken)
    e = ChunkEncoder(Codec("blosc-zstd", 1), 2, entropy_only=True)
    assert not e.entropy_only and e.direct
    assert "decode" in e.why_not_entropy or "Error" in e.why_not_entropy
    spec = StoreSpec(layer_ids=[1, 2], hidden_size=32, model_name="t")
    hs = _bf16_like(np.random.default_rng(5), (100, 2, 32))
    with TaskStoreWriter.open(
        tmp_path / "s.zarr", spec, StoreConfig(chunk_tokens=16, shard_tokens=64, fsync=False)
    ) as w:
        info = w.encoder_info()
        w.append("a", np.arange(100), np.ones(100, np.uint8), hs)
        w.finalize()
    assert info["entropy_only"] is False and info["why_not_entropy_only"]
    assert np.array_equal(open_dataset(tmp_path / "s.zarr").get_arrays(0)["hidden_states"], hs)
    assert verify(tmp_path / "s.zarr", True) == []


def test_store_of_entropy_only_frames_reads_back_through_zarr(tmp_path):
    import zarr

    spec = StoreSpec(layer_ids=[1, 2, 3], hidden_size=512, model_name="t")
    rng = np.random.default_rng(6)
    samples = [_bf16_like(rng, (int(t), 3, 512)) for t in rng.integers(1, 300, 12)]
    cfg = StoreConfig(chunk_tokens=64, shard_tokens=256, fsync=False, adaptive=False)
    with TaskStoreWriter.open(tmp_path / "s.zarr", spec, cfg) as w:
        assert w.encoder_info()["entropy_only"]
        for i, hs in enumerate(samples):
            w.append(f"s{i}", np.arange(len(hs)), np.ones(len(hs), np.uint8), hs)
        w.finalize()
    flat = np.asarray(zarr.open_array(tmp_path / "s.zarr" / "hidden_states", mode="r")[:])
    assert np.array_equal(flat.view(np.uint16), np.concatenate(samples))  # plain zarr, no eagle-batch reader
    assert verify(tmp_path / "s.zarr", True) == []


def test_resume_may_switch_encoders_within_one_store(tmp_path):
    # store.entropy_only is not part of the format: a task resumed under the other setting appends to the same
    # store, and every shard, old and new, reads back bit-exactly and verifies.
    spec = StoreSpec(layer_ids=[1, 2], hidden_size=256, model_name="t")
    rng = np.random.default_rng(7)
    samples = [_bf16_like(rng, (int(t), 2, 256)) for t in rng.integers(20, 200, 10)]
    path = tmp_path / "s.zarr"
    for part, entropy in ((samples[:5], True), (samples[5:], False)):
        cfg = StoreConfig(chunk_tokens=32, shard_tokens=128, fsync=False, adaptive=False, entropy_only=entropy)
        with TaskStoreWriter.open(path, spec, cfg) as w:
            assert w.encoder_info()["entropy_only"] is entropy
            start = w.num_committed
            for i, hs in enumerate(part, start):
                w.append(f"s{i}", np.arange(len(hs)), np.ones(len(hs), np.uint8), hs)
            w.commit()
            if not entropy:
                w.finalize()
    ds = open_dataset(path)
    assert [ds.get_arrays(i)["sample_id"] for i in range(len(ds))] == [f"s{i}" for i in range(10)]
    for i, hs in enumerate(samples):
        assert np.array_equal(ds.get_arrays(i)["hidden_states"], hs)
    assert verify(path, True) == []

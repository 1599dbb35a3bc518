"""append(..., on_release=...): the capture lends its rows; the writer compresses whole chunks straight from
them and hands them back exactly once, only when nothing reads them any more.

Every lent array is poisoned (overwritten) the moment it is released: a read after the release would
show up as wrong data in the store. The shard's raw crc32c is combined from per-chunk crcs on this
path, so `verify` (which recomputes it from the decoded rows) checks the combination too."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
import zarr
from store_testlib import EveryOtherSlot, make_sample

from eagle_batch.config import StoreConfig
from eagle_batch.store import TaskStoreWriter, open_dataset, verify
from eagle_batch.store.crc import crc32c_combine
from eagle_batch.store.ingest import Ingest


@pytest.mark.parametrize("slots", ["free", "mixed", "all-busy"])
def test_lent_rows_stored_bit_exact_and_released_once_after_last_read(tmp_path, spec, slots, monkeypatch):
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=True)
    monkeypatch.setattr(Ingest, "io_backlog", lambda self: 0)  # raw chunks allowed whenever slots are busy
    raw_chunks = []
    samples = [make_sample(s) for s in range(40)]
    released: Counter = Counter()
    lent: dict[int, np.ndarray] = {}

    def release(i):
        released[i] += 1
        lent[i].fill(0xFFFF)  # poison

    def open_writer():
        w = TaskStoreWriter.open(tmp_path / "a.zarr", spec, cfg)
        if slots != "free":  # "busy" slots keep chunks raw: lent rows must then be copied, not kept
            w._ingest._encode_slots = EveryOtherSlot(busy_all=slots == "all-busy")
        return w

    w = open_writer()
    for i, (sid, ids, mask, hs) in enumerate(samples):
        lent[i] = hs.copy()
        w.append(sid, ids, mask, lent[i], on_release=lambda i=i: release(i))
        if i % 7 == 6:
            w.commit()
        if i == 20:  # resume mid-shard: the restored prefix's crc joins the combination
            w.commit()
            raw_chunks.append(w.chunk_stats()["stored_raw"])
            w.close()
            w = open_writer()
    w.finalize()
    raw_chunks.append(w.chunk_stats()["stored_raw"])
    w.close()
    if slots != "free":
        assert sum(raw_chunks) > 0  # lent rows kept raw went through the IO-thread copy
    assert released == Counter(range(40))
    ref = np.concatenate([s[3] for s in samples])
    np.testing.assert_array_equal(
        zarr.open_array(tmp_path / "a.zarr" / "hidden_states", mode="r")[:].view(np.uint16), ref
    )
    ds = open_dataset(tmp_path / "a.zarr")
    for i in (0, 20, 21, 39):
        np.testing.assert_array_equal(ds.get_arrays(i)["hidden_states"], samples[i][3])
    assert verify(tmp_path / "a.zarr", True) == []


def test_lent_rows_released_when_append_fails(tmp_path, spec, small_cfg):
    sid, ids, mask, hs = make_sample(3)
    calls = []
    with TaskStoreWriter.open(tmp_path / "b.zarr", spec, small_cfg) as w:
        w.append(sid, ids, mask, hs, on_release=lambda: calls.append("first"))
        with pytest.raises(ValueError, match="already in"):
            w.append(sid, ids, mask, hs, on_release=lambda: calls.append("duplicate"))
        w.commit()
    assert sorted(calls) == ["duplicate", "first"]


def test_lent_rows_held_until_their_chunks_are_encoded(tmp_path, spec):
    """append() returns before compression ran; the rows stay lent until it did, then come back once."""
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=64, adaptive=False)
    gate = threading.Event()
    released = []
    with TaskStoreWriter.open(tmp_path / "c.zarr", spec, cfg) as w:
        stream = w._ingest.streams["hidden_states"]
        encode = stream.encoder.encode  # what the compression threads call
        stream.encoder.encode = lambda chunk, out: (gate.wait(10), encode(chunk, out))[1]  # they stall
        sid, ids, mask, hs = make_sample(5)
        w.append(sid, ids, mask, hs, on_release=lambda: released.append(threading.current_thread().name))
        assert released == [], "released while its chunks still wait for compression"
        gate.set()
        w.commit()
    assert len(released) == 1 and released[0].startswith("store-encode")
    assert verify(tmp_path / "c.zarr", True) == []


def test_crc32c_combine_matches_crc_of_concatenation():
    import crc32c

    rng = np.random.default_rng(0)
    for _ in range(100):
        a = rng.integers(0, 256, int(rng.integers(0, 5000)), dtype=np.uint8).tobytes()
        b = rng.integers(0, 256, int(rng.integers(0, 5000)), dtype=np.uint8).tobytes()
        assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


@pytest.mark.parametrize("slots", ["free", "all-busy"])
def test_blocks_of_samples_store_the_same_bytes_as_single_appends(tmp_path, spec, slots, monkeypatch):
    """append_block (an engine step's requests back to back, lent as one block): the store reads back exactly
    what per-sample appends give, the block comes back once after its last read, and only the block's edges
    are copied (chunks across sample boundaries are compressed in place)."""
    monkeypatch.setattr(Ingest, "io_backlog", lambda self: 0)
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=True)
    samples = [make_sample(s) for s in range(30)]
    groups = [samples[0:1], samples[1:5], samples[5:6], samples[6:13], samples[13:30]]
    released: Counter = Counter()
    blocks = []
    copied_chunks = Counter()  # hidden-state chunks that went through the stream's own buffer, per writer
    real_submit = Ingest.submit_encode

    def submit(self, st, chunks, loan):
        if st.layout.name == "hidden_states" and loan is None:
            copied_chunks[self.path.name] += len(chunks)
        return real_submit(self, st, chunks, loan)

    monkeypatch.setattr(Ingest, "submit_encode", submit)
    w = TaskStoreWriter.open(tmp_path / "blk.zarr", spec, cfg)
    if slots == "all-busy":
        w._ingest._encode_slots = EveryOtherSlot(busy_all=True)

    for k, g in enumerate(groups):
        block = np.concatenate([s[3] for s in g])
        blocks.append(block)

        def release(k=k):
            released[k] += 1
            blocks[k].fill(0xFFFF)  # poison: a later read would store wrong bytes

        w.append_block([s[0] for s in g], [s[1] for s in g], [s[2] for s in g], block, on_release=release)
        if k == 2:
            w.commit()
    w.finalize()
    w.close()
    assert released == Counter(range(len(groups)))

    ref_cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=False)
    with TaskStoreWriter.open(tmp_path / "one.zarr", spec, ref_cfg) as r:
        for sid, ids, mask, hs in samples:
            r.append(sid, ids, mask, hs, on_release=lambda: None)  # lent too: only chunks across samples copied
        r.finalize()
    assert copied_chunks["blk.zarr"] <= 2 * len(groups) < copied_chunks["one.zarr"]
    a, b = open_dataset(tmp_path / "blk.zarr"), open_dataset(tmp_path / "one.zarr")
    assert len(a) == len(b) == 30
    for i in range(30):
        x, y = a.get_arrays(i), b.get_arrays(i)
        assert a[i]["sample_id"] == samples[i][0]
        for key in ("input_ids", "loss_mask", "hidden_states"):
            np.testing.assert_array_equal(x[key], y[key])
    assert verify(tmp_path / "blk.zarr", True) == []


def test_a_block_is_all_or_nothing(tmp_path, spec, small_cfg):
    """One bad sample anywhere in a block: nothing of the block is queued, the error names the sample, the
    lent block comes back."""
    s = [make_sample(i) for i in range(3)]
    calls = []
    with TaskStoreWriter.open(tmp_path / "c.zarr", spec, small_cfg) as w:
        bad_mask = s[1][2][:-1]
        with pytest.raises(ValueError, match=f"sample {s[1][0]!r}: shapes disagree"):
            w.append_block(
                [x[0] for x in s],
                [x[1] for x in s],
                [s[0][2], bad_mask, s[2][2]],
                np.concatenate([x[3] for x in s]),
                on_release=lambda: calls.append(1),
            )
        with pytest.raises(ValueError, match="appears more than once"):
            w.append_block(
                [s[0][0], s[0][0]], [s[0][1], s[0][1]], [s[0][2], s[0][2]], np.concatenate([s[0][3], s[0][3]])
            )
        with pytest.raises(ValueError, match=r"hidden_states \("):
            w.append_block([x[0] for x in s], [x[1] for x in s], [x[2] for x in s], s[0][3])
        assert w.num_appended == 0 and w.num_tokens == 0
        w.append_block([x[0] for x in s], [x[1] for x in s], [x[2] for x in s], np.concatenate([x[3] for x in s]))
        w.commit()
    assert calls == [1]
    assert [r["sample_id"] for r in open_dataset(tmp_path / "c.zarr")] == [x[0] for x in s]

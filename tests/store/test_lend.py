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

from eagle_batch.config import StoreConfig
from eagle_batch.store import TaskStoreWriter, open_dataset, verify
from eagle_batch.store.crc import crc32c_combine
from store_testlib import EveryOtherSlot, make_sample


@pytest.mark.parametrize("slots", ["free", "mixed", "all-busy"])
def test_lent_rows_stored_bit_exact_and_released_once_after_last_read(tmp_path, spec, slots, monkeypatch):
    cfg = StoreConfig(chunk_tokens=8, shard_tokens=32, adaptive=True)
    monkeypatch.setattr(TaskStoreWriter, "_io_backlog", lambda self: 0)  # raw chunks allowed whenever slots are busy
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
            w._encode_slots = EveryOtherSlot(busy_all=slots == "all-busy")
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
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a.zarr" / "hidden_states", mode="r")[:].view(np.uint16), ref)
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
        stream = w._streams["hidden_states"]
        encode = stream.encode
        stream.encode = lambda chunk: (gate.wait(10), encode(chunk))[1]  # compression threads stall
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

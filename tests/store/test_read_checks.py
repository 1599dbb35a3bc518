"""The reader's checks on their own: a store written before records listed chunk crcs and carried seals still
reads (each shard file checked whole), a flipped byte there is refused, and the reader's error crosses a
process boundary (a DataLoader worker, a trainer rank) whole."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from store_testlib import make_sample

from eagle_batch.store import StoreCorruptError, TaskStoreWriter, open_dataset
from eagle_batch.store.crc import SEAL_KEY
from eagle_batch.store.errors import DamagedDataError


def _write(path, spec, cfg, n=6):
    samples = [make_sample(i) for i in range(n)]
    with TaskStoreWriter.open(path, spec, cfg) as w:
        for s in samples:
            w.append(*s)
        w.commit()
    return samples


def _as_written_before_checks(store):
    """Drop what older eagle-batch did not write: chunk crcs in the record, the record's and attributes' seals."""
    p = store / "progress.json"
    r = json.loads(p.read_text())
    r.pop(SEAL_KEY)
    for entries in r["shards"].values():
        for e in entries:
            e.pop("chunk_crc32c")
    p.write_text(json.dumps(r))
    z = store / "zarr.json"
    meta = json.loads(z.read_text())
    meta["attributes"]["eagle_batch"].pop(SEAL_KEY)
    z.write_text(json.dumps(meta))


def test_older_store_reads_and_a_flip_there_is_refused(tmp_path, spec, small_cfg):
    store = tmp_path / "s.zarr"
    samples = _write(store, spec, small_cfg)
    _as_written_before_checks(store)
    ds = open_dataset(store)
    for i, (sid, ids, mask, hs) in enumerate(samples):
        x = ds.get_arrays(i)
        assert x["sample_id"] == sid and np.array_equal(x["input_ids"], ids) and np.array_equal(x["loss_mask"], mask)
        assert np.array_equal(x["hidden_states"], hs)
    f = store / "loss_mask" / "c" / "0"
    data = bytearray(f.read_bytes())
    data[3] ^= 0x04
    f.write_bytes(bytes(data))
    with pytest.raises(DamagedDataError, match="loss_mask shard 0 .*crc32c differs") as e:
        open_dataset(store).get_arrays(0)
    assert e.value.sample_id == samples[0][0] and samples[0][0] in e.value.sample_ids


def test_a_record_with_an_unknown_key_and_no_seal_is_refused(tmp_path, spec, small_cfg):
    store = tmp_path / "s.zarr"
    _write(store, spec, small_cfg)
    p = store / "progress.json"
    p.write_text(p.read_text().replace(f'"{SEAL_KEY}"', '"content_crc32C"'))  # one bit of the seal's name
    with pytest.raises(StoreCorruptError, match="committed record\\) is damaged"):
        len(open_dataset(store))


def test_damaged_data_error_pickles_whole(tmp_path):
    e = DamagedDataError("msg", "/s.zarr", "hidden_states", 3, 1, ["a", "b"], "reason").for_sample("a")
    back = pickle.loads(pickle.dumps(e))
    assert (str(back), back.array, back.shard, back.chunk, back.sample_ids, back.sample_id, back.reason) == (
        "msg",
        "hidden_states",
        3,
        1,
        ["a", "b"],
        "a",
        "reason",
    )

"""The shared-memory worker -> driver transport (used when the vLLM worker is another process)."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import torch

from eagle_batch.capture.shm import ShmProducer, ShmReceiver
from eagle_batch.capture.sink import CapturedRequest
from eagle_batch.capture.writer import WriterThread
from eagle_batch.store.fp8 import E4M3


def _produce(spec, n, L, H):
    prod = ShmProducer(spec)
    for i in range(n):
        T = 5 + 7 * i
        rows = torch.arange(T * L * H, dtype=torch.float32).view(T, L, H) + i
        host, where = prod.alloc_host(rows.shape, rows.dtype, pin=False)
        host.copy_(rows)
        prod.put(CapturedRequest(f"s{i}", f"r{i}", np.arange(T), host, None, torch.tensor([True])), where)
    prod.close()


def _capture_through_ring(wt, sink, samples_factory, lengths, produce, ring_bytes, L, H):
    """Announce samples of `lengths` to `wt`; `produce` (a spawned process) sends their states through a ring
    of `ring_bytes` to `sink`; returns once all arrived and `wt` committed and closed."""
    samples = samples_factory(lengths, prefix="s")
    for i, s in enumerate(samples):
        s.sample_id, s.input_ids = f"s{i}", np.arange(len(s.input_ids))
    wt.expect(samples)
    rx = ShmReceiver(sink, ring_bytes=ring_bytes)
    try:
        p = mp.get_context("spawn").Process(target=produce, args=(rx.spec(), len(lengths), L, H))
        p.start()
        rx.wait_for(len(lengths), 0, timeout_s=120)
        p.join(30)
        assert p.exitcode == 0
        wt.commit(wait=True)
        wt.close()
    finally:
        rx.close()


def test_ring_wraps_and_applies_backpressure_across_processes(fake_writer_cls, samples_factory):
    """A ring smaller than the data: the producer (another process) must wait for the writer, records arrive
    in order, bytes are intact after wrap-around, and the ring is released only after the append."""
    L, H, n = 2, 16, 12
    biggest = (5 + 7 * (n - 1)) * L * H * 4
    w = fake_writer_cls()
    wt = WriterThread(w, L, H)

    class Sink:  # bf16 in the store: keep a float32 copy to check the bytes exactly
        got = {}

        def put(self, item):
            Sink.got[item.sample_id] = item.states.clone()
            wt.put(item)

    # a ring of twice the largest record forces wrap-around and waiting
    _capture_through_ring(wt, Sink(), samples_factory, [5 + 7 * i for i in range(n)], _produce, 2 * biggest, L, H)
    assert sorted(w.committed) == sorted(f"s{i}" for i in range(n))
    for i in range(n):
        T = 5 + 7 * i
        exp = torch.arange(T * L * H, dtype=torch.float32).view(T, L, H) + i
        assert torch.equal(Sink.got[f"s{i}"], exp), i
        assert torch.equal(w.committed[f"s{i}"]["hidden_states"], exp.to(torch.bfloat16))


def test_receiver_reports_missing_records():
    rx = ShmReceiver(sink=None, ring_bytes=1 << 20)
    try:
        import pytest

        with pytest.raises(RuntimeError, match="only 0 of 3 captured samples arrived"):
            rx.wait_for(3, 0, timeout_s=0.5)
    finally:
        rx.close()


def _bf16_rows(i, L, H):
    T = 3 + 5 * i
    return (torch.arange(T * L * H, dtype=torch.float32).view(T, L, H) * 0.37 - i).to(torch.bfloat16)


def _produce_bf16(spec, n, L, H):
    """Records of 1, 2, 3, ... requests' rows back to back (one engine step's finished requests each)."""
    prod = ShmProducer(spec)
    i = size = 0
    while i < n:
        size += 1
        group = list(range(i, min(n, i + size)))
        rows = torch.cat([_bf16_rows(j, L, H) for j in group])
        host, where = prod.alloc_host(rows.shape, rows.dtype, pin=False)
        host.copy_(rows)
        reqs = [(f"s{j}", f"r{j}", np.arange(len(_bf16_rows(j, L, H))), len(_bf16_rows(j, L, H))) for j in group]
        prod.put_rows(reqs, host, where, None, torch.ones(len(rows), dtype=torch.bool))
        i += len(group)
    prod.close()


def test_bf16_records_carry_their_bits_and_the_store_gets_them_exactly(tmp_path, samples_factory):
    """bf16 states (the GPU case) arrive with `bits`, a numpy view of the same ring bytes, which the writer
    thread appends without torch calls; records carry several requests' rows back to back; the store must
    hold exactly the producer's rows."""
    from eagle_batch.config import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter, hidden_states_to_uint16, open_dataset

    L, H, n = 2, 16, 9
    w = TaskStoreWriter.open(
        tmp_path / "s.zarr",
        StoreSpec(layer_ids=[1, 2], hidden_size=H, model_name="t"),
        StoreConfig(chunk_tokens=8, shard_tokens=32, fsync=False),
    )
    wt = WriterThread(w, L, H)
    seen = []

    class Sink:
        def put(self, item):
            assert item.bits is not None and item.bits.dtype == np.uint16
            assert item.bits.ctypes.data == item.states.data_ptr() and item.bits.shape == tuple(item.states.shape)
            seen.append(item.sample_id)
            wt.put(item)

    try:
        _capture_through_ring(wt, Sink(), samples_factory, [3 + 5 * i for i in range(n)], _produce_bf16, 1 << 20, L, H)
        w.finalize()
    finally:
        w.close()
    assert seen == [f"s{i}" for i in range(n)]
    ds = open_dataset(tmp_path / "s.zarr")
    for i in range(n):
        rec = ds[i]
        assert rec["sample_id"] == f"s{i}"
        np.testing.assert_array_equal(
            hidden_states_to_uint16(rec["hidden_states"]), hidden_states_to_uint16(_bf16_rows(i, L, H))
        )


def _collecting_receiver():
    """A receiver over a 1 MiB ring whose sink keeps every request it is handed (unreleased)."""
    got = []

    class Sink:
        def put(self, item):
            got.append(item)

    return ShmReceiver(Sink(), ring_bytes=1 << 20), got


def test_ring_space_is_freed_only_over_the_released_prefix():
    """The store releases records in any order (compression threads finish out of order); the producer's
    free-space signal may only move past records that are all released."""
    rx, got = _collecting_receiver()
    try:
        for i, (start, end) in enumerate([(0, 512), (512, 1024), (1024, 2048)]):
            rx._handle(([(f"s{i}", f"r{i}", np.arange(4), 4, True)], start, (2,), "bfloat16", end))
        consumed = lambda: int(rx._consumed[0])  # noqa: E731
        got[1].release()
        assert consumed() == 0  # record 0 is still being read
        got[2].release()
        assert consumed() == 0
        got[0].release()
        assert consumed() == 2048
        got[0].release()  # a second release changes nothing
        assert consumed() == 2048
    finally:
        rx.close()


def test_a_record_the_sink_refuses_is_released():
    """E.g. a sample arriving while no capture runs: the sink raises, and the ring must still move on."""

    class Refuse:
        def put(self, item):
            raise RuntimeError("no capture running")

    rx = ShmReceiver(Refuse(), ring_bytes=1 << 20)
    try:
        import pytest

        with pytest.raises(RuntimeError, match="no capture running"):
            rx._handle(
                ([("s0", "r0", np.arange(4), 4, True), ("s1", "r1", np.arange(4), 4, True)], 0, (2,), "bfloat16", 512)
            )
        assert int(rx._consumed[0]) == 512
    finally:
        rx.close()


def test_a_record_of_several_requests_is_freed_with_its_last_request():
    """One record per engine step: each request is its own view of the record's rows and released on its
    own; the record's bytes are free once all its requests are, and only after every record before it."""
    rx, got = _collecting_receiver()
    try:
        L, H = 2, 4
        rows = (np.arange(9 * L * H) % 65536).astype(np.uint16)
        rx._data[: rows.nbytes] = rows.view(np.uint8)
        rx._handle(
            (
                [
                    ("a", "ra", np.arange(2), 2, True),
                    ("b", "rb", np.arange(3), 3, False),
                    ("c", "rc", np.arange(4), 4, None),
                ],
                0,
                (L, H),
                "bfloat16",
                512,
            )
        )
        rx._handle(([("d", "rd", np.arange(1), 1, True)], 512, (L, H), "bfloat16", 1024))
        assert [g.sample_id for g in got] == ["a", "b", "c", "d"]
        assert [g.finite for g in got] == [True, False, None, True]
        np.testing.assert_array_equal(np.concatenate([g.bits for g in got[:3]]).reshape(-1), rows)
        assert [tuple(g.states.shape) for g in got[:3]] == [(2, L, H), (3, L, H), (4, L, H)]
        consumed = lambda: int(rx._consumed[0])  # noqa: E731
        got[3].release()
        got[2].release()
        got[0].release()
        got[0].release()  # twice: still one request
        assert consumed() == 0  # "b" of the first record is still being read
        got[1].release()
        assert consumed() == 1024
    finally:
        rx.close()


def test_a_non_finite_row_fails_the_capture_naming_its_sample(fake_writer_cls, samples_factory):
    """Per-row finite flags: the request holding the bad row fails (named), not its record neighbours."""
    import pytest

    from eagle_batch.capture.writer import CaptureError

    L, H = 2, 16
    w = fake_writer_cls()
    wt = WriterThread(w, L, H)
    with pytest.raises(CaptureError, match=r"sample s2: hidden_states contain NaN/Inf"):
        _capture_through_ring(wt, wt, samples_factory, [3 + 5 * i for i in range(4)], _produce_one_nan, 1 << 20, L, H)
    assert sorted(w.committed) == []  # the commit after the failure never happened


def _produce_one_nan(spec, n, L, H):
    prod = ShmProducer(spec)
    rows = torch.cat([_bf16_rows(j, L, H) for j in range(n)])
    lengths = [len(_bf16_rows(j, L, H)) for j in range(n)]
    bad = sum(lengths[:2]) + 1  # second row of s2
    rows[bad, 1, 3] = float("nan")
    finite = torch.isfinite(rows).flatten(1).all(1)
    host, where = prod.alloc_host(rows.shape, rows.dtype, pin=False)
    host.copy_(rows)
    prod.put_rows([(f"s{j}", f"r{j}", np.arange(lengths[j]), lengths[j]) for j in range(n)], host, where, None, finite)
    prod.close()


def _produce_fp8(spec, n, L, H):
    """The float8 connector's records: each request's rows quantized and packed (capture/fp8.py), back to back."""
    from eagle_batch.capture import fp8

    prod = ShmProducer(spec)
    for i in range(0, n, 2):
        group = list(range(i, min(n, i + 2)))
        rows = fp8.pack(torch.cat([_bf16_rows(j, L, H) for j in group]), E4M3)
        host, where = prod.alloc_host(rows.shape, rows.dtype, pin=False)
        host.copy_(rows)
        reqs = [(f"s{j}", f"r{j}", np.arange(len(_bf16_rows(j, L, H))), len(_bf16_rows(j, L, H))) for j in group]
        prod.put_rows(reqs, host, where, None, torch.ones(len(rows), dtype=torch.bool))
    prod.close()


def test_float8_records_cross_the_ring_into_a_float8_store(tmp_path, samples_factory):
    from eagle_batch.config import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter, open_dataset
    from eagle_batch.store.fp8 import dequantize, quantize

    L, H, n = 2, 16, 5
    spec = StoreSpec(layer_ids=[1, 2], hidden_size=H, model_name="t", dtype="float8_e4m3")
    w = TaskStoreWriter.open(tmp_path / "s.zarr", spec, StoreConfig(chunk_tokens=8, shard_tokens=32, fsync=False))
    wt = WriterThread(w, L, H)
    try:
        _capture_through_ring(wt, wt, samples_factory, [3 + 5 * i for i in range(n)], _produce_fp8, 1 << 20, L, H)
        w.finalize()
    finally:
        w.close()
    ds = open_dataset(tmp_path / "s.zarr")
    for i in range(n):
        q = quantize(_bf16_rows(i, L, H).view(torch.uint16).numpy(), E4M3)
        np.testing.assert_array_equal(ds.get_arrays(i)["hidden_states"], dequantize(q.codes, q.scales, E4M3))

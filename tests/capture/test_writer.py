"""Write-time checks, the writer thread and run_capture's commit/resume logic (no vLLM needed)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from eagle_batch.capture import backend as backend_mod
from eagle_batch.capture.engine import run_capture
from eagle_batch.capture.sink import CapturedRequest
from eagle_batch.capture.writer import CaptureError, WriterThread, check_captured
from eagle_batch.config import load_config

L, H = 3, 8


def _states(n, fill=None):
    g = torch.Generator().manual_seed(n)
    st = torch.randn(n, L, H, generator=g)
    if fill is not None:
        st[n // 2, 1, 3] = fill
    return st


def test_check_captured_accepts_good_and_names_sample_on_each_failure():
    ids = np.arange(10)
    check_captured("a", ids, ids, _states(10), L, H, True)
    with pytest.raises(CaptureError, match=r"sample b: token-id echo mismatch.*position 4"):
        bad = ids.copy()
        bad[4] = 99
        check_captured("b", ids, bad, _states(10), L, H, True)
    with pytest.raises(CaptureError, match=r"sample c: token-id echo mismatch \(engine saw 9 tokens"):
        check_captured("c", ids, ids[:9], _states(10), L, H, True)
    with pytest.raises(CaptureError, match=r"sample d: hidden_states shape \(9, 3, 8\)"):
        check_captured("d", ids, ids, _states(9), L, H, True)
    with pytest.raises(CaptureError, match=r"sample e: hidden_states contain NaN/Inf \(1 values; first at token 5"):
        check_captured("e", ids, ids, _states(10, float("nan")), L, H, True)
    with pytest.raises(CaptureError, match="sample f: .*NaN/Inf"):
        check_captured("f", ids, ids, _states(10, float("inf")), L, H, True)
    check_captured("g", ids, ids, _states(10, float("nan")), L, H, False)  # check disabled


def test_writer_thread_stops_at_first_bad_sample(fake_writer_cls, samples_factory):
    w = fake_writer_cls()
    wt = WriterThread(w, L, H)
    samples = samples_factory([5, 6, 7])
    wt.expect(samples)
    wt.put(CapturedRequest(samples[0].sample_id, "r0", samples[0].input_ids, _states(5)))
    wt.put(CapturedRequest(samples[1].sample_id, "r1", samples[1].input_ids, _states(6, float("nan"))))
    wt.put(CapturedRequest(samples[2].sample_id, "r2", samples[2].input_ids, _states(7)))
    with pytest.raises(CaptureError, match=f"sample {samples[1].sample_id}: hidden_states contain NaN"):
        wt.commit(wait=True)
    assert list(w.pending) == [samples[0].sample_id] and w.commits == 0  # nothing committed after the failure
    with pytest.raises(CaptureError):
        wt.close()


def test_writer_thread_rejects_unknown_duplicate_and_missing(fake_writer_cls, samples_factory):
    s = samples_factory([4, 4])
    wt = WriterThread(fake_writer_cls(), L, H)
    wt.put(CapturedRequest("nope", "r", np.arange(4), _states(4)))
    with pytest.raises(CaptureError, match="sample nope: the engine returned it but was never submitted"):
        wt.flush()
    wt = WriterThread(fake_writer_cls(), L, H)
    wt.expect(s)
    wt.put(CapturedRequest(s[0].sample_id, "r", s[0].input_ids, _states(4)))
    with pytest.raises(CaptureError, match=f"1 samples handed to the engine never came back.*{s[1].sample_id}"):
        wt.commit(wait=True)


def test_writer_thread_backpressure_bounds_pending_bytes(fake_writer_cls, samples_factory):
    samples = samples_factory([50] * 6)
    gate = threading.Event()

    class Slow(fake_writer_cls):
        def append(self, *a, **kw):
            gate.wait(5)
            super().append(*a, **kw)

    w = Slow()
    one = 50 * L * H * 4
    wt = WriterThread(w, L, H, max_pending_bytes=2 * one)
    wt.expect(samples)
    t = threading.Thread(
        target=lambda: [wt.put(CapturedRequest(s.sample_id, "r", s.input_ids, _states(50))) for s in samples]
    )
    t.start()
    t.join(0.5)
    assert t.is_alive(), "put() must block while the writer is behind by max_pending_bytes"
    gate.set()
    t.join(5)
    wt.commit(wait=True)
    wt.close()
    assert len(w.committed) == 6


class _FakeBackend:
    """Stands in for a vLLM engine: returns deterministic states, records batches."""

    name = "fake"

    def __init__(self):
        self.layer_ids, self.hidden_size, self.batches = [1, 2, 3], H, []

    def run_batch(self, samples, sink):
        self.batches.append([s.sample_id for s in samples])
        for s in samples:
            sink.put(CapturedRequest(s.sample_id, "r", np.asarray(s.input_ids), _states(len(s.input_ids))))


def _cfg(tmp_path, *over):
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text('{"num_hidden_layers": 4, "hidden_size": 8}')
    return load_config(None, [f"run_dir={tmp_path}", f"model.path={tmp_path / 'm'}", *over])


def test_run_capture_skips_committed_commits_and_converts(tmp_path, fake_writer_cls, samples_factory):
    cfg = _cfg(tmp_path, "extract.batch_samples=3", "extract.commit_interval_s=0")
    samples = samples_factory([5, 9, 3, 7, 4, 6, 8])
    w = fake_writer_cls(committed=[samples[1].sample_id, samples[4].sample_id])
    be = _FakeBackend()
    stats = run_capture(cfg, samples, w, backend=be)
    assert [sid for b in be.batches for sid in b] == [s.sample_id for i, s in enumerate(samples) if i not in (1, 4)]
    assert stats.skipped_committed == 2 and stats.samples == 5 and stats.tokens == 5 + 3 + 7 + 6 + 8
    assert set(w.committed) == {s.sample_id for s in samples} and not w.pending
    assert w.commits == 3  # one per batch (interval 0) ... the last batch's commit is the final one
    assert w.append_threads == {"eagle-batch-writer"}  # never on the engine/driver thread
    got = w.committed[samples[0].sample_id]
    assert got["hidden_states"].dtype == torch.bfloat16
    torch.testing.assert_close(got["hidden_states"].float(), _states(5), rtol=1e-2, atol=1e-2)
    assert np.array_equal(got["loss_mask"], samples[0].loss_mask)
    # a second run finds everything committed and starts nothing
    assert run_capture(cfg, samples, w, backend=None).samples == 0


def test_run_capture_should_stop_commits_then_returns(tmp_path, fake_writer_cls, samples_factory):
    cfg = _cfg(tmp_path, "extract.batch_samples=2", "extract.commit_interval_s=3600")
    samples = samples_factory([4] * 7)
    w = fake_writer_cls()
    be = _FakeBackend()
    calls = []
    stats = run_capture(cfg, samples, w, should_stop=lambda: calls.append(1) or len(calls) >= 2, backend=be)
    assert stats.stopped_early and len(be.batches) == 2
    assert len(w.committed) == 4 and w.commits == 1 and not w.pending
    stats = run_capture(cfg, samples, w, backend=be)  # resume: only the rest
    assert stats.samples == 3 and len(w.committed) == 7


def test_run_capture_rejects_bad_inputs_naming_the_sample(tmp_path, fake_writer_cls, samples_factory):
    cfg = _cfg(tmp_path, "model.max_model_len=8")
    s = samples_factory([4, 9])
    with pytest.raises(Exception, match=rf"sample {s[1].sample_id}: 9 tokens, model.max_model_len=8 allows 7"):
        run_capture(cfg, s, fake_writer_cls(), backend=_FakeBackend())
    s = samples_factory([4, 8])  # vLLM needs the prompt plus the one generated token: 8 does not fit either
    with pytest.raises(Exception, match=rf"sample {s[1].sample_id}: 8 tokens, model.max_model_len=8 allows 7"):
        run_capture(cfg, s, fake_writer_cls(), backend=_FakeBackend())
    s = samples_factory([4, 4])
    s[1].sample_id = s[0].sample_id
    with pytest.raises(CaptureError, match=f"sample {s[0].sample_id}: sample id appears more than once"):
        run_capture(cfg, s, fake_writer_cls(), backend=_FakeBackend())


def test_auto_backend_falls_back_to_hooks_with_reason(tmp_path, monkeypatch, caplog):
    cfg = _cfg(tmp_path, "extract.backend=auto")

    def broken(*a, **k):
        raise RuntimeError("MLA verifiers are unsupported")

    import eagle_batch.capture.hooks as hooks_mod
    import eagle_batch.capture.native as native_mod

    monkeypatch.setattr(native_mod, "NativeBackend", broken)
    monkeypatch.setattr(hooks_mod, "HooksBackend", lambda cfg, ids: "hooks-backend")
    with caplog.at_level("WARNING"):
        assert backend_mod.make_backend(cfg) == "hooks-backend"
    assert "native capture backend unavailable (RuntimeError: MLA verifiers are unsupported)" in caplog.text
    with pytest.raises(CaptureError, match="extract.backend='gpu'"):
        backend_mod.make_backend(cfg, "gpu")


def test_writer_thread_hands_consecutive_rows_of_one_record_over_as_one_block(fake_writer_cls, samples_factory):
    """Requests queued together that lie back to back in one transport record reach the store as one block;
    a gap, another record or a request without a record splits the runs. Each request's memory comes back
    exactly once."""
    gate = threading.Event()

    class GatedWriter(fake_writer_cls):
        def append(self, *a, **k):
            gate.wait(10)  # the first append holds the writer thread until everything else is queued
            return super().append(*a, **k)

    w = GatedWriter()
    wt = WriterThread(w, L, H)
    lengths = [3, 4, 5, 2, 6, 3, 4]
    samples = samples_factory(lengths)
    wt.expect(samples)
    rec_a = torch.randn(3 + 4 + 5, L, H).to(torch.bfloat16)  # s0, s1, s2
    rec_b = torch.randn(2 + 6 + 1 + 3, L, H).to(torch.bfloat16)  # s3, s4, a row of nobody, s5
    released = []

    def put(i, rec, row0):
        n = lengths[i]
        wt.put(
            CapturedRequest(
                samples[i].sample_id,
                f"r{i}",
                samples[i].input_ids,
                rec[row0 : row0 + n],
                release=lambda i=i: released.append(i),
                block=rec,
                row0=row0,
            )
        )

    wt.expect([type(samples[0])("warm", np.arange(2), np.ones(2, np.uint8))])
    wt.put(CapturedRequest("warm", "rw", np.arange(2), _states(2)))  # blocks in the gated append
    put(0, rec_a, 0), put(1, rec_a, 3), put(2, rec_a, 7)
    put(3, rec_b, 0), put(4, rec_b, 2)
    put(5, rec_b, 9)  # rows 8..9 belong to nobody: not contiguous with s4
    wt.put(
        CapturedRequest(
            samples[6].sample_id,
            "r6",
            samples[6].input_ids,
            _states(4).to(torch.bfloat16),
            release=lambda: released.append(6),
        )
    )
    gate.set()
    wt.commit(wait=True)
    wt.close()
    ids = [s.sample_id for s in samples]
    assert w.blocks == [ids[0:3], ids[3:5]]
    assert sorted(released) == list(range(7))
    for i in range(5):
        rec, row0 = (rec_a, [0, 3, 7][i]) if i < 3 else (rec_b, [0, 2][i - 3])
        assert torch.equal(w.committed[ids[i]]["hidden_states"], rec[row0 : row0 + lengths[i]])

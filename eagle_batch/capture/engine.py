"""`run_capture`, the loop an array task's capture work runs: samples -> backend -> writer thread -> store.

    stats = run_capture(cfg, samples, writer, should_stop=task.should_stop)

The backend (`backend.py`: native, hooks or hf) runs batches of `extract.batch_samples`; every captured
request reaches the `WriterThread` (`writer.py`), which checks it and appends it to the task's store
writer. Commits happen on the writer thread between batches, so the engine keeps computing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from eagle_batch.config import RunConfig
from eagle_batch.store.protocol import StoreWriterProtocol

from .backend import make_backend
from .writer import CaptureError, WriterThread


def _check_lengths(cfg: RunConfig, samples: Sequence[Any]) -> None:
    for s in samples:
        n = len(s.input_ids)
        if n == 0:
            raise CaptureError(f"sample {s.sample_id}: empty input_ids; re-run prepare (it drops empty rows).")
        if n >= cfg.model.max_model_len:  # vLLM needs the prompt plus the one token it generates
            raise CaptureError(
                f"sample {s.sample_id}: {n} tokens, model.max_model_len={cfg.model.max_model_len} "
                f"allows {cfg.model.max_model_len - 1}; raise model.max_model_len or lower "
                "data.max_length and re-run prepare."
            )
        if len(s.loss_mask) != n:
            raise CaptureError(f"sample {s.sample_id}: loss_mask has {len(s.loss_mask)} entries for {n} tokens.")


def _chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    n = max(1, int(n))
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


@dataclass
class CaptureStats:
    backend: str = ""
    samples: int = 0
    tokens: int = 0
    skipped_committed: int = 0
    commits: int = 0
    seconds: float = 0.0
    tokens_per_s: float = 0.0
    stopped_early: bool = False
    writer_busy_s: float = 0.0  # the writer thread's time in append (checks, hand-over to the store)
    backpressure_s: float = 0.0  # time the engine side waited because the store was behind

    def as_dict(self) -> dict:
        return asdict(self)


def run_capture(
    cfg: RunConfig,
    samples: Sequence[Any],
    writer: StoreWriterProtocol,
    should_stop: Callable[[], bool] | None = None,
    backend=None,
    max_pending_bytes: int = 4 << 30,
) -> CaptureStats:
    """Capture every sample not yet committed in `writer` and append it; see the module docstring.

    Commits at most every `extract.commit_interval_s` (between batches, on the writer thread, so the
    engine keeps computing) and always at the end, or when `should_stop()` turns true (checked after
    each batch; the function then commits and returns). `backend`: a started backend to reuse (tests,
    benchmarks); by default one is started from the config and shut down on return.
    """
    t0 = time.perf_counter()
    committed = set(writer.committed_sample_ids)
    todo = [s for s in samples if s.sample_id not in committed]
    stats = CaptureStats(skipped_committed=len(samples) - len(todo))
    ids = [s.sample_id for s in todo]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CaptureError(f"sample {dup}: sample id appears more than once in this task's samples")
    _check_lengths(cfg, todo)
    if not todo:
        stats.seconds = time.perf_counter() - t0
        return stats
    own = backend is None
    if own:
        backend = make_backend(cfg)
    stats.backend = backend.name
    wt = WriterThread(
        writer,
        len(backend.layer_ids),
        backend.hidden_size,
        cfg.extract.check_finite,
        max_pending_bytes=max_pending_bytes,
    )
    try:
        last_commit = time.monotonic()
        for batch in _chunks(todo, cfg.extract.batch_samples):
            wt.expect(batch)
            backend.run_batch(batch, wt)
            wt.raise_if_failed()
            if time.monotonic() - last_commit >= cfg.extract.commit_interval_s:
                wt.commit(wait=False)  # queued behind this batch's appends; the next batch starts now
                last_commit = time.monotonic()
            if should_stop is not None and should_stop():
                stats.stopped_early = True
                break
        wt.commit(wait=True)
        wt.close()
    except BaseException:
        with contextlib.suppress(BaseException):
            wt.close()
        raise
    finally:
        if own:
            backend.close()
    stats.samples, stats.tokens, stats.commits = wt.stats.samples, wt.stats.tokens, wt.stats.commits
    stats.writer_busy_s, stats.backpressure_s = wt.stats.write_s, wt.stats.put_wait_s
    stats.seconds = time.perf_counter() - t0
    stats.tokens_per_s = stats.tokens / stats.seconds if stats.seconds > 0 else 0.0
    return stats

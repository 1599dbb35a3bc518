"""Opt-in timeline of a store writer's work, to see which stage a capture waits for.

`store.trace_dir=DIR`: each writer appends one JSON line per event to `DIR/<pid>-<id>.jsonl` when
it closes: `t` (seconds, time.perf_counter), `ev`, the thread's name, and the event's fields. Events:
`append` (t0 = start, writer thread), `encode` (t0 = start, a compression thread; `raw` chunks are not
encoded), `shard` (t0 = IO job start, `ready` = when its chunks were encoded, t = written), `commit`.
Off (the default) it costs one attribute check per event.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path


class StoreTrace:
    def __init__(self, folder: str | None):
        self.folder = Path(folder) if folder else None
        self.events: list[dict] = []  # list.append is atomic: no lock on the hot path
        self._stop = threading.Event()
        if self.folder is not None:
            threading.Thread(target=self._sample_gil, name="store-trace-gil", daemon=True).start()

    @property
    def on(self) -> bool:
        return self.folder is not None

    def stamp(self) -> float:
        """A time for an event's t0 or other fields (0.0 when tracing is off: no clock read on the hot path)."""
        return time.perf_counter() if self.folder is not None else 0.0

    def event(self, ev: str, t0: float, **fields) -> None:
        if self.folder is not None:
            self.events.append(
                dict(ev=ev, t0=t0, t=time.perf_counter(), thread=threading.current_thread().name, **fields)
            )

    def _sample_gil(self, nap: float = 0.001, every: float = 0.1) -> None:
        late: list[float] = []
        t_window = time.perf_counter()
        while not self._stop.is_set():
            t = time.perf_counter()
            time.sleep(nap)
            now = time.perf_counter()
            late.append(now - t - nap)
            if now - t_window >= every:
                self.events.append(
                    dict(
                        ev="gil",
                        t0=t_window,
                        t=now,
                        thread="store-trace-gil",
                        n=len(late),
                        late_ms=1e3 * sum(late) / len(late),
                        late_max_ms=1e3 * max(late),
                    )
                )
                late, t_window = [], now

    def dump(self) -> Path | None:
        self._stop.set()
        if self.folder is None or not self.events:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{os.getpid()}-{id(self):x}.jsonl"
        with open(path, "a") as f:
            for e in self.events:
                f.write(json.dumps(e) + "\n")
        self.events = []
        return path

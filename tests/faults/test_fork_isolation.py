"""The fault suite forks its task processes; a fork must not share a lock that a killed sibling can leave taken."""

from __future__ import annotations

import os
import signal
import time

from tests.faults import faultlib as F


def _fork(body) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            F._own_tqdm_lock()
            body()
        finally:
            os._exit(0)
    return pid


def test_a_child_killed_inside_a_progress_bar_does_not_block_the_next():
    from tqdm.auto import tqdm

    with open(os.devnull, "w") as null:
        list(tqdm(range(2), file=null))  # the parent has made tqdm's class-wide lock, as model loading does
        taken_r, taken_w = os.pipe()
        holder = _fork(lambda: (tqdm.get_lock().acquire(), os.write(taken_w, b"1"), time.sleep(60)))
        assert os.read(taken_r, 1) == b"1"
        os.kill(holder, signal.SIGKILL)  # killed while it holds the lock, as a kill trial can do
        os.waitpid(holder, 0)
        nxt = _fork(lambda: list(tqdm(range(2), file=null)))
        deadline = time.monotonic() + 20
        while not os.waitpid(nxt, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                os.kill(nxt, signal.SIGKILL)
                os.waitpid(nxt, 0)
                raise AssertionError("the next forked child blocked on tqdm's lock the killed one held")
            time.sleep(0.05)

"""Live progress: a bar on a terminal (a real pty here), nothing when the output is a file or a pipe."""

from __future__ import annotations

import io
import os
import pty
import select

from eagle_batch.progress import progress


def _read_all(fd: int) -> str:
    """Everything written to the pty so far (several reads: the bar is drawn in pieces)."""
    out = b""
    while select.select([fd], [], [], 0.5)[0]:
        out += os.read(fd, 65536)
    return out.decode(errors="replace")


def test_a_bar_on_a_terminal():
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            assert list(progress(range(5), desc="verify", unit="shard", stream=tty)) == list(range(5))
            tty.flush()
        out = _read_all(master)
    finally:
        os.close(master)
        os.close(slave)
    assert "verify" in out and "5/5" in out and "shard" in out


def test_nothing_in_a_log_or_pipe_and_nothing_when_disabled():
    log = io.StringIO()
    assert list(progress(range(3), desc="verify", stream=log)) == [0, 1, 2]
    assert log.getvalue() == ""
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            list(progress(range(3), desc="verify", stream=tty, enabled=False))  # --no-progress
            tty.write("end\n")
            tty.flush()
        assert _read_all(master).strip() == "end"
    finally:
        os.close(master)
        os.close(slave)

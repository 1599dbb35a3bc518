"""Loan: hand something back exactly once, when the last of its holders is done with it.

Memory travels from the engine to the disk without copies: the capture's shared-memory ring lends a
record's rows to the capture's writer thread, which lends them to the store, whose compression threads
read them in place. Each lender must get its memory (ring space, back-pressure budget) back exactly once:
never twice (it would free space still in use by the next record) and never while anyone still reads it
(the next record would overwrite rows not yet compressed). A Loan is that rule in one place:

    loan = Loan(release, *args)   # one holder: whoever created it
    loan.hold()                   # another holder (a compression job that reads the memory)
    loan.drop()                   # a holder is done; the last drop calls release(*args), once
    loan()                        # the same as drop(): a Loan is a release callback

Drops past the last one do nothing, from any thread: a callback that may be called again (on an error
path, say) cannot release twice. Used by the store's writer (lent rows) and the capture (ring slots,
budget); a `hold()` after the release is a bug of the caller and is not detected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Loan:
    __slots__ = ("_n", "_lock", "_release", "_args")

    def __init__(self, release: Callable[..., None], *args) -> None:
        self._n = 1
        self._lock = threading.Lock()
        self._release: Callable[..., None] | None = release
        self._args = args

    def hold(self) -> None:
        with self._lock:
            self._n += 1

    def drop(self) -> None:
        with self._lock:
            self._n -= 1
            if self._n != 0:
                return
            release, self._release = self._release, None
        if release is not None:
            release(*self._args)

    __call__ = drop

    @property
    def released(self) -> bool:
        return self._release is None

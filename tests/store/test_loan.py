"""Loan: memory handed back exactly once, when the last holder is done (the store's lent rows, the capture's
ring slots and back-pressure budget)."""

from __future__ import annotations

import threading

from eagle_batch.store.loan import Loan


def test_loan_releases_once_after_the_last_holder():
    calls = []
    loan = Loan(calls.append, "x")
    loan.hold()
    loan.hold()
    loan.drop()
    loan.drop()
    assert calls == [] and not loan.released
    loan()  # the creator's drop, as a callback
    assert calls == ["x"] and loan.released
    loan.drop()  # past the last: nothing
    loan()
    assert calls == ["x"]


def _drop_concurrently(loan: Loan, n: int) -> None:
    start = threading.Barrier(n)

    def drop():
        start.wait()
        loan.drop()

    threads = [threading.Thread(target=drop) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_loan_released_once_under_concurrent_drops():
    for _ in range(50):
        calls = []
        loan = Loan(calls.append, 1)
        for _ in range(7):
            loan.hold()
        _drop_concurrently(loan, 16)  # 8 holders, 8 extra drops
        assert calls == [1]

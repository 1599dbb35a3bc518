"""The shard plan balances tokens, covers every sample once and is deterministic."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle_batch.data import plan_lpt


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5000), max_size=300), st.integers(1, 17))
def test_plan_covers_each_sample_once_and_is_balanced(lengths, num_tasks):
    tasks = plan_lpt(lengths, num_tasks)
    assert len(tasks) == num_tasks
    assert sorted(i for t in tasks for i in t) == list(range(len(lengths)))
    assert all(t == sorted(t) for t in tasks)
    loads = [sum(lengths[i] for i in t) for t in tasks]
    # LPT bound: the heaviest task exceeds the lightest by at most the largest single sample.
    if lengths:
        assert max(loads) - min(loads) <= max(lengths)
    assert plan_lpt(lengths, num_tasks) == tasks


def test_plan_balances_tokens_not_rows():
    rng = random.Random(0)
    # Long-tailed lengths like real chat data: a row-count split would be badly unbalanced.
    lengths = [int(rng.lognormvariate(6, 1.2)) + 1 for _ in range(20000)]
    tasks = plan_lpt(lengths, 64)
    loads = [sum(lengths[i] for i in t) for t in tasks]
    mean = sum(loads) / len(loads)
    assert max(loads) / mean < 1.01
    row_split = [sum(lengths[i::64]) for i in range(64)]
    assert max(row_split) / mean > max(loads) / mean


def test_plan_rejects_zero_tasks():
    with pytest.raises(ValueError):
        plan_lpt([1, 2], 0)

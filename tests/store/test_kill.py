"""SIGKILL a writer subprocess at random moments, resume, and compare with an uninterrupted run.

CI runs 5 kill points on one store; tests/stress/kill_writer.py runs >= 50 (docs/explanation/reliability.md).
"""

from __future__ import annotations

import pytest
from store_testlib import kill_trials


@pytest.mark.parametrize(
    "adaptive,dtype",
    [(False, "bfloat16"), (True, "bfloat16"), (False, "float8_e4m3")],
    ids=["compress-all", "adaptive", "float8"],
)
def test_sigkill_at_random_moments_then_resume_is_identical(tmp_path, adaptive, dtype):
    result = kill_trials(
        tmp_path, kills_per_store=6, stores=1, n_samples=60, seed=1234, min_kills=5, adaptive=adaptive, dtype=dtype
    )
    assert result["kills"] >= 5, result
    # At least one kill must land after something was committed and before the end, or the test proved little.
    assert any(0 < c < 60 for c in result["committed_at_kill"]), result

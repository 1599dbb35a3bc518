"""An engine that does not finish in time ends the serving check with one line that says so, no traceback."""

from __future__ import annotations

import pytest

from eagle_batch.errors import UserError
from eagle_batch.evaluate.serve_check import _run_engine


def test_an_engine_past_its_time_is_one_line_naming_what_it_served():
    # A real engine subprocess (it imports vLLM, which alone takes longer than this) stopped at its limit.
    with pytest.raises(UserError) as e:
        _run_engine({"draft": None, "k": 0}, timeout_s=0.5)
    msg = str(e.value)
    assert e.value.exit_code == 1 and "\n" not in msg
    assert "serving the target alone did not finish in" in msg and "less loaded machine" in msg

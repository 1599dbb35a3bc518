"""A task's rate, and the run's ETA, come from its commits, not from its start: an engine that takes a minute
to start must not make the first estimate several times too long. Until a rate is measured, `status` says
"estimating"."""

from __future__ import annotations

import json

from eagle_batch.launch import state as S
from eagle_batch.launch import task as T
from eagle_batch.launch.status import progress_line, totals


def test_rate_is_measured_from_the_first_commit_and_eta_says_estimating_until_then(tmp_path, monkeypatch):
    clock = {"t": 1000.0}
    monkeypatch.setattr(T.time, "time", lambda: clock["t"])
    attempt = S.Attempt(job_id="1_0", restart=0, host="h", pid=1, started=1000.0)
    rec = T._AttemptRecord(tmp_path, 0, attempt)
    rec.set_totals(10, 10_000)
    rec.report(0, 0)  # the work opened its output
    clock["t"] = 1120.0  # two minutes of engine start-up, then the first commit
    rec.report(2, 1000)
    st = S.read_state(tmp_path, 0)
    assert st.tok_s == 0 and st.tokens_committed == 1000  # one commit: no rate yet
    clock["t"] = 1130.0
    rec.report(4, 3000)
    st = S.read_state(tmp_path, 0)
    assert st.tok_s == 200.0  # 2000 tokens in the 10 s since the first commit, not 3000 / 130 s
    # The attempt's history keeps where it started, for the throughput plot.
    assert st.extra["history"][0] == [1000.0, 0] and st.extra["history"][-1] == [1130.0, 3000]


def _row(task_id: int, state: str, tok_s: float, committed: int, total: int):
    from eagle_batch.launch.status import TaskRow

    return TaskRow(
        task_id=task_id, state=state, slurm_state="", job_id="", samples_committed=0, samples_total=1,
        tokens_committed=committed, tokens_total=total, progress=committed / total, tok_s=tok_s, eta_s=None,
        attempts=1, failures=0, log="", last_error="",
    )  # fmt: skip


def test_run_eta_waits_until_every_running_task_has_a_rate():
    rows = [_row(0, "running", 200.0, 3000, 10_000), _row(1, "running", 0.0, 0, 10_000)]
    t = totals(rows)
    assert t["eta_s"] is None and t["estimating"]
    assert "eta estimating" in progress_line({"totals": t})
    rows[1].tok_s = 300.0
    t = totals(rows)
    assert t["eta_s"] == round((20_000 - 3000) / 500.0, 1) and not t["estimating"]
    assert "eta 34s" in progress_line({"totals": t})
    json.dumps(t)  # what `status --json` prints

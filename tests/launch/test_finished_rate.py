"""A finished task and a finished run show their average capture tok/s, not 0: a short task (one or two
commits) never measures a steady rate, and nothing runs once the run is done."""

from __future__ import annotations

from eagle_batch.launch import state as S
from eagle_batch.launch.status import average_capture_rate, progress_line, run_average_rate


def _done(task_id: int, tokens: int, spans: list[tuple[float, float]]) -> S.TaskState:
    attempts = [S.Attempt(f"local-1_{task_id}", 0, "h", 1, started=a, ended=b, outcome="done") for a, b in spans]
    return S.TaskState(task_id, status="done", attempts=attempts, tokens_committed=tokens, tok_s=0.0)


def test_a_done_task_shows_its_average_over_its_attempts():
    st = _done(0, 3000, [(100.0, 110.0), (200.0, 220.0)])  # 30 s of attempts
    assert average_capture_rate(st) == 100.0
    assert average_capture_rate(_done(1, 10, [])) == 0.0


def test_a_finished_run_shows_its_wall_average(tmp_path):
    states = [_done(0, 1000, [(100.0, 110.0)]), _done(1, 1000, [(110.0, 120.0)])]  # one after the other
    for st in states:
        S.write_state(tmp_path, st)
    assert run_average_rate([S.read_state(tmp_path, t) for t in (0, 1)], 2000) == 100.0  # 2000 tokens in 20 s
    line = progress_line(
        {
            "totals": {
                "done": 2,
                "tasks": 2,
                "progress": 1.0,
                "tokens_committed": 2000,
                "tokens_total": 2000,
                "tok_s": 100.0,
                "eta_s": None,
                "all_done": True,
                "states": {"done": 2},
            }
        }
    )
    assert "100 capture tok/s (average)" in line and " 0 tok/s" not in line

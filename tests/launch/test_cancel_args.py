"""`eagle-batch cancel RUN --task N` names a task the run does not have instead of cancelling nothing quietly."""

from __future__ import annotations

import time

from eagle_batch.cli import main
from eagle_batch.cli.cancel import _ranges
from eagle_batch.launch.state import Submission, append_submission


def test_an_unknown_task_is_named_with_the_run_s_tasks(tmp_path, capsys):
    run = tmp_path / "run"
    append_submission(run, Submission(job_id="123", executor="slurm", tasks=[0, 1, 2, 5], time=time.time()))
    assert main(["cancel", str(run), "--task", "1", "--task", "99"]) == 2
    err = capsys.readouterr().err
    assert "--task 99: no such task" in err and "(tasks 0-2, 5)" in err and "eagle-batch status" in err


def test_ranges_compacts_runs_of_ids():
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert _ranges([3]) == "3"
    assert _ranges([]) == "none"

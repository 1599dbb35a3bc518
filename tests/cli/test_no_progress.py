"""`--no-progress` is taken by every command (the README promises it of every long step), and turns the live
progress of `--wait` into the final line alone."""

from __future__ import annotations

import pytest

from eagle_batch.cli import COMMANDS, main
from tests.launch.test_local_executor import cli, make_run, no_traceback


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_takes_no_progress(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "--no-progress" in capsys.readouterr().out


def test_extract_wait_no_progress_prints_the_final_line_only(tmp_path):
    run, cfg = make_run(tmp_path, 1, gpus_per_node=0)
    (run / "faults" / "sleep_s").write_text("0.3")  # a few seconds: several polls of --wait
    r = cli("extract", cfg, "--wait", "--no-progress", "--interval", "0.2", env={})
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    progress = [line for line in r.stdout.splitlines() if "tasks done |" in line]
    assert progress == [progress[-1]] and progress[-1].startswith("1/1 tasks done | 100.0% tokens"), r.stdout

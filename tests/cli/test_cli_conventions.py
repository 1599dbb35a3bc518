"""The conventions every command follows: RUN names a run folder and is checked before the command runs,
PATH a run folder or a task store; no empty choice in help; exit status 2 for a usage or input mistake;
--no-progress silences the libraries' bars too."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from eagle_batch.cli import COMMANDS, build_parser, main
from eagle_batch.errors import UserError


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return build_parser(list(COMMANDS))[1]


def _positionals(parser: argparse.ArgumentParser) -> list[str]:
    return [a.metavar or a.dest for a in parser._actions if not a.option_strings]


def test_a_run_folder_is_called_run_and_a_run_or_store_path(parsers):
    for name in ("status", "resume", "cancel", "aggregate", "validate", "evaluate"):
        assert _positionals(parsers[name])[0] == "RUN", name
    for name in ("verify", "export-data"):
        assert _positionals(parsers[name])[0] == "PATH", name
    for name, parser in parsers.items():
        for word in ("run_dir", "path", "source"):
            assert word not in _positionals(parser), (name, word)


def test_no_command_offers_an_empty_choice(parsers):
    for name, parser in parsers.items():
        for action in parser._actions:
            assert "" not in (action.choices or []), (name, action.option_strings)
        assert "{," not in parser.format_help(), name


@pytest.mark.parametrize("command", ["status", "resume", "cancel", "aggregate", "validate", "evaluate"])
def test_a_missing_or_plain_folder_is_named_as_such_with_exit_2(tmp_path, capsys, command):
    missing = tmp_path / "no-such-run"
    assert main([command, str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"RUN folder {missing} does not exist" in err and "plan.json" not in err
    plain = tmp_path / "plain"
    plain.mkdir()
    assert main([command, str(plain)]) == 2
    err = capsys.readouterr().err
    assert f"{plain} is not a run folder (no config.yaml)" in err and "eagle-batch prepare" in err


def test_an_input_mistake_exits_2_and_a_usage_mistake_too(tmp_path):
    assert UserError("x").exit_code == 2 and UserError("x", 1).exit_code == 1
    r = subprocess.run([sys.executable, "-m", "eagle_batch", "status"], capture_output=True, text=True)
    assert r.returncode == 2 and "RUN" in r.stderr


def test_no_progress_silences_the_libraries_bars():
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    from eagle_batch.progress import silence_library_progress

    try:
        silence_library_progress()
        assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
    finally:
        hf_logging.enable_progress_bar()
        from huggingface_hub.utils import enable_progress_bars

        enable_progress_bars()

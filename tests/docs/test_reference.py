"""The generated reference pages (docs/reference/cli.md, config.md) match the code: a new option, a changed
help text or a new config key without regenerating fails here, naming the command that regenerates."""

from __future__ import annotations

import argparse

from eagle_batch import reference
from eagle_batch.cli import COMMANDS, EXIT_FAILED, build_parser


def test_committed_pages_are_current():
    stale = reference.stale()
    assert not stale, f"{', '.join(map(str, stale))} stale: regenerate with `{reference.REGENERATE}` and commit"


def test_every_command_option_and_config_key_is_in_the_pages():
    cli, config = reference.cli_page(), reference.config_page()
    _, parsers = build_parser(list(COMMANDS))
    for name, parser in parsers.items():
        assert f"## {name}\n" in cli
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert f"`{flag}" in cli or f", {flag}" in cli, (name, flag)
    assert set(EXIT_FAILED) == set(COMMANDS), "every command says what its exit status 1 means"
    for key in ("`model.path` (`str`, default none (required))", "`store.dtype`", "`slurm.container.image`"):
        assert key in config


def test_a_config_key_without_a_comment_is_refused(tmp_path):
    docs = reference.field_docs(
        "class A:\n    # what x is\n    x: int = 1\n    y: int = 2  # what y is\n\n    z: int = 3\n"
    )
    assert docs["A"] == {"x": "what x is", "y": "what y is", "z": ""}


def test_check_mode_names_the_stale_page_and_the_command(tmp_path, monkeypatch, capsys):
    for path in reference.PAGES.values():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("old\n")
    monkeypatch.setattr(reference, "ROOT", tmp_path)
    assert reference.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/reference/cli.md is stale" in err and reference.REGENERATE in err


def test_evaluate_help_shows_the_prompt_format_it_refers_to():
    """--prompts' help says "(see above)": the command's description above the options holds the format."""
    _, parsers = build_parser(["evaluate"])
    text = parsers["evaluate"].format_help()
    assert "(see above)" in text
    assert text.index("JSON Lines with one prompt per line") < text.index("options:") < text.index("(see above)")

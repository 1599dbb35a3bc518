"""`eagle-batch` command line: a thin dispatcher.

One module per command in this package (eagle_batch/cli/NAME.py), imported only when called (vLLM and
torch are slow to import). A command module exposes `add_arguments(parser)` and `run(args) -> int`; its
docstring is the command's --help description.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import textwrap

# name -> (module, one-line help), in data-flow order.
COMMANDS: dict[str, tuple[str, str]] = {
    "regenerate": ("eagle_batch.cli.regenerate", "the target writes the answers of a chat dataset itself"),
    "prepare": ("eagle_batch.cli.prepare", "chat datasets -> token ids, loss masks and a shard plan"),
    "extract": ("eagle_batch.cli.extract", "submit the hidden-state extraction array"),
    "status": ("eagle_batch.cli.status", "show every task of a run"),
    "resume": ("eagle_batch.cli.resume", "resubmit only unfinished or failed tasks"),
    "cancel": ("eagle_batch.cli.cancel", "cancel a run's jobs (Slurm, or the local executor's tasks)"),
    "aggregate": ("eagle_batch.cli.aggregate", "build one zero-copy view over all task stores"),
    "verify": ("eagle_batch.cli.verify", "re-check checksums, offsets, dtypes and values"),
    "validate": ("eagle_batch.cli.validate", "compare captured states with transformers"),
    "train": ("eagle_batch.cli.train", "train an EAGLE-3 draft on a run's hidden states"),
    "drafts": ("eagle_batch.cli.drafts", "rank the drafts trained from a run by held-out acceptance"),
    "evaluate": ("eagle_batch.cli.evaluate", "serve the draft with vLLM: acceptance, identical outputs"),
    "export-data": ("eagle_batch.cli.export_data", "a run's hidden states as speculators' or SpecForge's files"),
    "import-data": ("eagle_batch.cli.import_data", "a speculators data folder -> an eagle-batch task store"),
    "demo": ("eagle_batch.demo", "run the whole pipeline on the embedded SmolLM2 default"),
    "bench": ("eagle_batch.cli.bench", "benchmarks that print one JSON object"),
}


# What exit status 1 means for each command (the other statuses mean the same everywhere: EXIT_CODES).
EXIT_FAILED: dict[str, str] = {
    "regenerate": "with --wait, a task failed or gave up; else the plan holds nothing to generate",
    "prepare": "not used (bad rows and data with no usable sample are input mistakes: 2)",
    "extract": "with --wait, a task failed or gave up",
    "status": "not used",
    "resume": "with --wait, a resubmitted task failed again",
    "cancel": "Slurm refused to cancel a job, or nothing of the run is queued or running",
    "aggregate": "a store is damaged, or with --require-all, one is missing or incomplete (2: none complete yet)",
    "verify": "a store is damaged (2: nothing extracted yet)",
    "validate": "a layer's captured states differ from the transformers reference beyond the thresholds",
    "train": "the training failed (a rank crashed more often than train.max_restarts)",
    "drafts": "no draft of the run has finished",
    "evaluate": "an output with the draft differed from the target alone's beyond the tie tolerance",
    "export-data": "not used",
    "import-data": "not used",
    "demo": "a step failed, or the outputs with the draft differed from the target's",
    "bench": "the benchmark failed",
}

# OS errors about a path (permissions, a file where a folder should be, a full or read-only disk) are the
# user's environment, not a bug: reported as one line naming the path.
_ENVIRONMENT_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ENOENT,
    errno.ENOSPC,
    errno.EROFS,
    errno.EDQUOT,
    errno.EEXIST,
    errno.ENAMETOOLONG,
}


# A full filesystem or quota: the work failed (exit 1). The other path errors are a path given wrong (exit 2).
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}

_ENVIRONMENT_HINTS = {
    errno.EACCES: "check its permissions, or choose a path you can write",
    errno.EPERM: "check its permissions, or choose a path you can write",
    errno.ENOTDIR: "a part of this path is a file, not a folder; choose another path",
    errno.EISDIR: "a file was expected there, not a folder",
    errno.ENOSPC: "the filesystem is full: free space or choose another filesystem; committed work is kept",
    errno.EDQUOT: "the disk quota is exhausted: free space or choose another filesystem; committed work is kept",
    errno.EROFS: "the filesystem is read-only; choose a writable path",
    errno.EEXIST: "it is in the way: choose another path or remove it",
}


def _add_no_progress(p: argparse.ArgumentParser) -> None:
    """Every command takes --no-progress (the README promises it of every long step): those with live output
    read `args.no_progress`; the others have none to turn off."""
    try:
        p.add_argument("--no-progress", action="store_true", help="no live progress line or bar")
    except argparse.ArgumentError:  # the command defines it with its own help
        pass


# The commands that start engines or compile kernels here or in their jobs: they import from the code caches.
ENGINE_COMMANDS = ("extract", "resume", "train", "evaluate", "regenerate", "validate", "demo")


def _warn_about_shared_caches(command: str) -> None:
    from eagle_batch import environment
    from eagle_batch.ownership import cache_warnings

    for line in cache_warnings(environment.code_caches()):
        print(f"eagle-batch {command}: warning: {line}", file=sys.stderr)


def _parse(parser: argparse.ArgumentParser, command: argparse.ArgumentParser | None, argv: list[str]):
    """The chosen command's arguments in any order: `prepare a.yaml --no-progress data.limit=3` as well as
    `prepare a.yaml data.limit=3 --no-progress` (a plain parse reads positionals up to the first flag only).
    A command whose own arguments argparse cannot intermix (a sub-command, as `bench NAME ...`) parses plainly."""
    if command is None:
        return parser.parse_args(argv)
    try:
        return command.parse_intermixed_args(argv[1:])
    except TypeError:  # argparse refuses to intermix REMAINDER / sub-parser positionals
        return parser.parse_args(argv)


# What the exit status means, for every command (the reference lists each command's own meaning of 1).
EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "the work ran and failed, or a check found a problem (the command's own meaning is listed with it), "
    "or the disk is full",
    2: "a usage or input mistake: a bad argument, config key or data file, a path that is missing or cannot be "
    "written, a run folder at the wrong stage (nothing extracted yet); reported before any work starts",
    130: "interrupted (Ctrl-C)",
}


def _formatter(prog: str) -> argparse.HelpFormatter:
    """Help keeps the descriptions' own line breaks (the module docstrings), wrapped at 100 columns."""
    return argparse.RawDescriptionHelpFormatter(prog, width=100, max_help_position=32)


def add_command(sub, name: str) -> argparse.ArgumentParser:
    """The parser of one command, its arguments added (imports the command's module)."""
    module_name, help_ = COMMANDS[name]
    module = importlib.import_module(module_name)
    p = sub.add_parser(name, help=help_, description=command_description(name), formatter_class=_formatter)
    p.set_defaults(_module=module_name, command=name)
    module.add_arguments(p)
    _add_no_progress(p)
    return p


def command_description(name: str) -> str:
    """A command's --help text above its options: its module's docstring (the one-line help if it has none)."""
    module = importlib.import_module(COMMANDS[name][0])
    return (module.__doc__ or COMMANDS[name][1]).strip()


def build_parser(commands=()) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `eagle-batch` parser; the commands named in `commands` get their arguments (their modules are
    imported), the others only their name and one-line help."""
    from eagle_batch import __version__

    parser = argparse.ArgumentParser(
        prog="eagle-batch",
        formatter_class=_formatter,
        epilog="exit status:\n"
        + "\n".join(
            textwrap.fill(text, 100, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7)
            for code, text in EXIT_CODES.items()
        ),
    )
    parser.add_argument("--version", action="version", version=f"eagle-batch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    loaded = {}
    for name, (module, help_) in COMMANDS.items():
        if name in commands:
            loaded[name] = add_command(sub, name)
        else:
            sub.add_parser(name, help=help_, description=help_).set_defaults(_module=module, command=name)
    return parser, loaded


def _check_run_folders(parser: argparse.ArgumentParser | None, args: argparse.Namespace) -> None:
    """Every positional argument named RUN is a run folder: checked before the command runs, so that a
    mistyped path is reported as such (not as a missing file inside it)."""
    from eagle_batch.cli.common import RUN, require_run_folder

    for action in parser._actions if parser is not None else ():
        if not action.option_strings and action.metavar == RUN and getattr(args, action.dest, None):
            require_run_folder(getattr(args, action.dest))


def main(argv: list[str] | None = None) -> int:
    from eagle_batch.config import ConfigError
    from eagle_batch.errors import UserError

    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = argv[0] if argv else None
    parser, loaded = build_parser([chosen] if chosen in COMMANDS else [])
    args = _parse(parser, loaded.get(chosen), argv)
    if args.command in ENGINE_COMMANDS:
        _warn_about_shared_caches(args.command)
    try:
        _check_run_folders(loaded.get(chosen), args)
        return int(importlib.import_module(args._module).run(args) or 0)
    except ConfigError as e:
        print(f"eagle-batch {args.command}: configuration error: {e}", file=sys.stderr)
        return e.exit_code
    except UserError as e:  # names the file / key and the fix: one line, no traceback
        print(f"eagle-batch {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `eagle-batch status --json | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        return 0
    except OSError as e:
        # A full disk is the environment even where the failing write names no file (a write to an open file).
        if e.errno not in _ENVIRONMENT_ERRNOS or not (e.filename or e.errno in _FULL_ERRNOS):
            raise
        # A folder or file the user named that cannot be read or written: the path, the reason, what to do.
        hint = _ENVIRONMENT_HINTS.get(e.errno, "")
        where = f"{e.filename}: " if e.filename else ""
        print(f"eagle-batch {args.command}: {where}{e.strerror}{'; ' + hint if hint else ''}", file=sys.stderr)
        return 1 if e.errno in _FULL_ERRNOS else 2  # a full disk fails the work; a wrong path is the input
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`eagle-batch` command line: a thin dispatcher.

Each command lives next to the stage it drives and is imported only when called (vLLM and torch are
slow to import). A command module exposes `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

# name -> (module, one-line help), in data-flow order.
COMMANDS: dict[str, tuple[str, str]] = {
    "regenerate": ("eagle_batch.regenerate.cli", "the target writes the answers of a chat dataset itself"),
    "prepare": ("eagle_batch.data.cli", "chat datasets -> token ids, loss masks and a shard plan"),
    "extract": ("eagle_batch.launch.cli_extract", "submit the hidden-state extraction array"),
    "status": ("eagle_batch.launch.cli_status", "show every task of a run"),
    "resume": ("eagle_batch.launch.cli_resume", "resubmit only unfinished or failed tasks"),
    "cancel": ("eagle_batch.launch.cli_cancel", "cancel a run's jobs (Slurm, or the local executor's tasks)"),
    "aggregate": ("eagle_batch.store.cli_aggregate", "build one zero-copy view over all task stores"),
    "verify": ("eagle_batch.store.cli_verify", "re-check checksums, offsets, dtypes and values"),
    "validate": ("eagle_batch.capture.cli_validate", "compare captured states with transformers"),
    "train": ("eagle_batch.launch.cli_train", "train an EAGLE-3 draft on a run's hidden states"),
    "drafts": ("eagle_batch.launch.cli_drafts", "rank the drafts trained from a run by held-out acceptance"),
    "evaluate": ("eagle_batch.train.cli_evaluate", "serve the draft with vLLM: acceptance, identical outputs"),
    "export-data": ("eagle_batch.interop.cli_export", "a run's hidden states as speculators' or SpecForge's files"),
    "import-data": ("eagle_batch.interop.cli_import", "a speculators data folder -> an eagle-batch task store"),
    "demo": ("eagle_batch.demo", "run the whole pipeline on the embedded SmolLM2 default"),
    "bench": ("eagle_batch.bench.cli", "benchmarks that print one JSON object"),
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


# The commands that start engines or compile kernels here or in their jobs: they import from the code caches.
ENGINE_COMMANDS = ("extract", "resume", "train", "evaluate", "regenerate", "validate", "demo")


def _warn_about_shared_caches(command: str) -> None:
    from eagle_batch import environment
    from eagle_batch.ownership import cache_warnings

    for line in cache_warnings(environment.code_caches()):
        print(f"eagle-batch {command}: warning: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from eagle_batch.config import ConfigError
    from eagle_batch.errors import UserError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="eagle-batch")
    from eagle_batch import __version__

    parser.add_argument("--version", action="version", version=f"eagle-batch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = argv[0] if argv else None
    chosen_parser = None
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module, command=name)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
            _add_no_progress(p)
            chosen_parser = p
    args = _parse(parser, chosen_parser, argv)
    if args.command in ENGINE_COMMANDS:
        _warn_about_shared_caches(args.command)
    try:
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
        if e.errno not in _ENVIRONMENT_ERRNOS or not (e.filename or e.errno in (errno.ENOSPC, errno.EDQUOT)):
            raise
        # A folder or file the user named that cannot be read or written: the path, the reason, what to do.
        hint = _ENVIRONMENT_HINTS.get(e.errno, "")
        where = f"{e.filename}: " if e.filename else ""
        print(f"eagle-batch {args.command}: {where}{e.strerror}{'; ' + hint if hint else ''}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Argument helpers shared by the commands: `CONFIG [CONFIG ...] [key=value ...]`, and typed numbers whose
bad values argparse reports as a usage error naming the flag (exit 2), before any work starts."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle_batch.config import ConfigError, RunConfig, load_config
from eagle_batch.config.load import RESOLVED_NAME
from eagle_batch.errors import UserError

# The metavar of a positional argument that is a run folder: the CLI checks it before the command runs.
RUN = "RUN"


def require_run_folder(path: str) -> None:
    """A RUN argument names a run folder (the config's run_dir: config.yaml, prepared/, stores/), or the
    command stops here with a usage error (exit 2) that says why not."""
    folder = Path(path)
    if not folder.exists():
        raise UserError(f"RUN folder {path} does not exist: name a run folder (the run_dir of its config)", 2)
    if not folder.is_dir():
        raise UserError(f"{path} is a file, not a RUN folder: name the run folder (the run_dir of its config)", 2)
    # config.yaml: a run; prepared/, stores/, state/ or slurm/ alone: a run's parts (import-data writes stores)
    parts = ("prepared", "stores", "state", "slurm")
    if not (folder / RESOLVED_NAME).is_file() and not any((folder / d).is_dir() for d in parts):
        raise UserError(
            f"{path} is not a run folder (no {RESOLVED_NAME}): run `eagle-batch prepare CONFIG run_dir={path}` "
            "first, or name the folder a run was prepared in",
            2,
        )


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        nargs="+",
        metavar="CONFIG.yaml|key=value",
        help="one or more YAML config files, merged in order (paths, or shipped names such as "
        "models/llama-3.1-8b.yaml; see configs/), then key=value overrides, e.g. extract.num_tasks=8",
    )


def config_sources(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(YAML files, key=value overrides) in the order given."""
    files = [a for a in args.config if "=" not in a]
    overrides = [a for a in args.config if "=" in a]
    return files, overrides


def config_from_args(args: argparse.Namespace, overrides: list[str] | None = None) -> RunConfig:
    """The config of CONFIG.yaml ... key=value (`overrides` replaces the command line's key=value list)."""
    files, given = config_sources(args)
    overrides = given if overrides is None else overrides
    if not files:
        raise ConfigError(
            "no config file given: name at least one YAML file (e.g. configs/demo.yaml) before the key=value overrides."
        )
    return load_config(files, overrides)


def _number(kind: type, low: float, high: float | None = None, name: str = ""):
    """An argparse `type=` that reads a `kind` number in [low, high] (high None: no upper bound)."""
    bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
    what = name or f"{'an integer' if kind is int else 'a number'} {bounds}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {what}") from None
        if value != value or value < low or (high is not None and value > high):  # value != value: NaN
            raise argparse.ArgumentTypeError(f"{text}: expected {what}")
        return value

    parse.__name__ = what  # argparse names the type by it in its own messages
    return parse


def int_at_least(low: int):
    return _number(int, low)


def float_at_least(low: float):
    return _number(float, low)


def int_in(low: int, high: int):
    return _number(int, low, high)


def int_list_at_least(low: int):
    """A comma-separated list of integers >= low (e.g. DataLoader worker counts "0,1,2")."""
    one = int_at_least(low)

    def parse(text: str) -> list[int]:
        values = [one(part.strip()) for part in text.split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of integers >= {low}")
        return values

    parse.__name__ = f"comma-separated integers >= {low}"
    return parse


# A share of something, as vLLM's gpu_memory_utilization: in (0, 1] (0 itself means "the default" where used).
share_or_default = _number(float, 0.0, 1.0, "a share in (0, 1], or 0 for the default")


def add_interval_argument(p: argparse.ArgumentParser) -> None:
    """`--interval` of the commands that follow a run with --wait (launch/follow.py's default rule)."""
    p.add_argument(
        "--interval",
        type=float,
        default=None,
        help="seconds between progress updates (--wait); default 5 s, growing with the run's size (a second "
        "per 500 tasks above 2,500) to keep the load on a parallel file system's metadata server bounded",
    )

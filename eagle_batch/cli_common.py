"""Argument helpers shared by commands that take `CONFIG [CONFIG ...] [key=value ...]`."""

from __future__ import annotations

import argparse

from eagle_batch.config import ConfigError, RunConfig, load_config


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

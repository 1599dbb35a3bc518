"""Argument helpers shared by commands that take `CONFIG [key=value ...]`."""

from __future__ import annotations

import argparse

from eagle_batch.config import RunConfig, load_config


def add_config_arguments(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    p.add_argument("config", nargs=None if config_required else "?", help="YAML config file (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. extract.num_tasks=8")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return load_config(args.config, args.overrides)

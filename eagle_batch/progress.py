"""Live progress of long CLI steps on the console: a tqdm bar on a terminal, nothing in logs or pipes.

    for x in progress(items, desc="verify", unit="shard", enabled=not args.no_progress):
        ...

The bar goes to stderr, so `--json` output on stdout stays parseable. Not a terminal (a Slurm log, a pipe,
CI): no bar at all; the command's own result lines say what happened. Commands that follow a job for
minutes (extract --wait, train) print their own periodic lines there instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO


def on_terminal(stream: TextIO | None = None) -> bool:
    s = stream if stream is not None else sys.stderr
    return bool(getattr(s, "isatty", None) and s.isatty())


def progress(
    iterable: Iterable | None = None,
    *,
    desc: str,
    total: int | None = None,
    unit: str = "it",
    enabled: bool = True,
    stream: TextIO | None = None,
    **kwargs: Any,
):
    """A tqdm over `iterable` (or a manual one with `total`), shown only when enabled and on a terminal."""
    from tqdm import tqdm

    s = stream if stream is not None else sys.stderr
    show = enabled and on_terminal(s)
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        file=s,
        disable=not show,
        ncols=_columns(s) if show else None,
        **kwargs,
    )


def _columns(stream: TextIO) -> int:
    """The terminal's width; 80 where it reports none (a pty nobody sized, some consoles say 0 columns)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80


def silence_library_progress() -> None:
    """No progress bars from the libraries either (transformers' "Loading checkpoint shards", the hub's
    downloads): what `--no-progress` promises covers every bar the command would show."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    disable_progress_bars()

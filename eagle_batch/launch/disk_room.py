"""Room on the run's filesystem for the hidden states an extraction is about to capture, checked before
anything is submitted: a store that cannot fit fails at the first full chunk hours into a run (its commits
are kept, and it resumes once there is room, but the hours are lost).

The tokens left are the plan's tokens of the tasks to run minus what each has committed; their bytes are
counted raw and at the best compression measured (store/footprint.py). When even the best case needs more
than the free space, that is an error; when only the raw size does, a warning (it fits if the states
compress as chat states usually do). `resume` checks the same (on a disk still full its tasks would fail at
once); both commands take extract.check_disk=false to submit anyway (a setting that changes no data: it is not
part of the run's fingerprint). Other writers on the same filesystem (another run extracting beside this
one) are not foreseen: the check sees the free space now.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from eagle_batch.errors import UserError
from eagle_batch.store.footprint import least_bytes_per_token, raw_bytes_per_token
from eagle_batch.units import human_bytes

from .state import read_state


class NoRoomError(UserError):
    """The states left to capture cannot fit the free space under RUN/stores; the message names the folder,
    the space needed and what to do."""

    exit_code = 2


def _existing(path: Path) -> Path:
    """The nearest folder of `path` that exists (a new run's stores folder is made by its tasks)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def tokens_left(run_dir: str | Path, prepared, todo: list[int]) -> int:
    """The plan's tokens of the tasks in `todo` that their stores have not committed yet."""
    left = 0
    for t in todo:
        st = read_state(run_dir, t)
        left += max(0, prepared.task_num_tokens(t) - (st.tokens_committed if st else 0))
    return left


def check_disk_room(
    cfg, num_layers: int, hidden_size: int, tokens: int, free: int | None = None, resume: bool = False
) -> str | None:
    """Raise NoRoomError when `tokens` tokens of states cannot fit the free space under RUN/stores even at the
    best compression measured; return a warning when they fit only compressed; None when they fit raw.
    `free` (bytes) is the filesystem's free space unless given. `resume`: the advice names `resume`'s
    command line instead of `extract`'s (both take extract.check_disk=false to submit anyway)."""
    stores = Path(cfg.run_dir) / "stores"
    where = _existing(stores)
    free = shutil.disk_usage(where).free if free is None else free
    raw = tokens * raw_bytes_per_token(num_layers, hidden_size, cfg.store.dtype)
    least = tokens * least_bytes_per_token(num_layers, hidden_size, cfg.store.dtype, cfg.store.codec)
    what = (
        f"{tokens:,} tokens of hidden states left to capture ({num_layers} layers x {hidden_size}, "
        f"store.dtype={cfg.store.dtype}) take {human_bytes(raw)} raw"
    )
    fixes = (
        "free space there, put run_dir on a larger filesystem, extract fewer samples (data.limit, then prepare "
        "again), or store float8 states (store.dtype=float8_e5m2: about half of bf16's bytes)"
    )
    out_of_space = (
        f"A task that runs out of space stops with its commits kept: {fixes}, then `eagle-batch resume {cfg.run_dir}`."
    )
    if least > free:
        if resume:
            anyway = f"`eagle-batch resume {cfg.run_dir} extract.check_disk=false` submits anyway"
            fixes = f"free at least {human_bytes(least - free)} there, then `eagle-batch resume {cfg.run_dir}` again"
        else:
            anyway = "adding extract.check_disk=false to this command submits anyway"
        raise NoRoomError(
            f"{stores}: {what} and at least {human_bytes(least)} compressed, but its filesystem ({where}) has "
            f"{human_bytes(free)} free. Nothing was submitted. {fixes[0].upper() + fixes[1:]}; {anyway}."
        )
    if raw > free:
        return (
            f"warning: {stores}: {what}, more than the {human_bytes(free)} free on its filesystem; it fits only "
            f"if they compress to {free / raw:.2f} of that or less (chat states compress to 0.62-0.71 with "
            f"store.codec=blosc-zstd, less on a node whose CPUs are busy). {out_of_space}"
        )
    return None


def capture_room(cfg, todo: list[int], resume: bool = False) -> str | None:
    """check_disk_room for the tasks in `todo` of a capture run (None for another work, nothing to do, or
    extract.check_disk=false). `resume`: the advice is resume's (its tasks' committed tokens are not counted
    either way)."""
    if cfg.extract.work != "capture" or not cfg.extract.check_disk or not todo:
        return None
    from eagle_batch.config import model_info, resolve_layer_ids
    from eagle_batch.data import PreparedDataset

    info = model_info(cfg.model.path)
    layers = len(resolve_layer_ids(cfg.model, info))
    tokens = tokens_left(cfg.run_dir, PreparedDataset(cfg.run_dir), todo)
    return check_disk_room(cfg, layers, info.hidden_size, tokens, resume=resume)

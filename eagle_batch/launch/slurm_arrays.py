"""How many Slurm arrays a submission of N tasks becomes, and how the run's parallelism is shared among them.

Slurm refuses an array with an index at or above the cluster's MaxArraySize (`scontrol show config`; the
default 1001 allows indices 0-1000). A submission of more tasks is split into `ceil(N / max)` arrays of
near-equal size, so they drain at about the same time; each array is one line of RUN/slurm/submissions.jsonl
(array index i runs that line's `tasks[i]`), and `status`, `resume` and `cancel` read all lines as one run.

`slurm.array_parallelism` is the most tasks of the submission running at once: each of its k arrays gets
`array_parallelism / k` (the remainder to the first ones, at least 1), so the total stays within it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence

from .state import SubmitError

# Slurm's own default when the controller does not say (slurm.conf MaxArraySize).
SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001


def cluster_max_array_size(timeout_s: float = 30.0) -> int | None:
    """MaxArraySize of the cluster (`scontrol show config`, one call), or None when it cannot be read."""
    try:
        r = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", r.stdout, re.MULTILINE) if r.returncode == 0 else None
    return int(m.group(1)) if m else None


def max_array_tasks(configured: int) -> int:
    """Tasks one array may hold: `slurm.max_array_size` when set (> 0), else the cluster's MaxArraySize."""
    if configured < 0:
        raise SubmitError(f"slurm.max_array_size={configured} is negative; use 0 (the cluster's MaxArraySize) or more.")
    if configured > 0:
        return configured
    return cluster_max_array_size() or SLURM_DEFAULT_MAX_ARRAY_SIZE


def split_tasks(task_ids: Sequence[int], max_size: int) -> list[list[int]]:
    """`task_ids` in ceil(N / max_size) consecutive parts of near-equal size (each at most max_size)."""
    ids = list(task_ids)
    if max_size < 1:
        raise ValueError(f"max_size must be at least 1, got {max_size}")
    k = -(-len(ids) // max_size) if ids else 0
    out, start = [], 0
    for i in range(k):
        size = len(ids) // k + (1 if i < len(ids) % k else 0)
        out.append(ids[start : start + size])
        start += size
    return out


def share_parallelism(total: int, arrays: int) -> list[int]:
    """`total` running tasks shared by `arrays` arrays (the first ones take the remainder; each at least 1)."""
    return [max(1, total // arrays + (1 if i < total % arrays else 0)) for i in range(arrays)]

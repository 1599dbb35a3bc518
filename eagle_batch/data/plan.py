"""Shard plan: samples -> array tasks, balanced by token count (prefill cost is ~linear in tokens)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def plan_lpt(num_tokens: Sequence[int], num_tasks: int) -> list[list[int]]:
    """Greedy longest-processing-time assignment; returns each task's sample indices in input order.

    Largest samples first, each to the currently lightest task (ties: lowest task id), so the result is
    deterministic and the heaviest task exceeds the mean by at most one sample's tokens (LPT is within
    4/3 of optimal). Input order is kept inside a task so reruns and diffs read naturally.
    """
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    order = sorted(range(len(num_tokens)), key=lambda i: (-int(num_tokens[i]), i))
    heap = [(0, t) for t in range(num_tasks)]
    tasks: list[list[int]] = [[] for _ in range(num_tasks)]
    for i in order:
        load, t = heapq.heappop(heap)
        tasks[t].append(i)
        heapq.heappush(heap, (load + int(num_tokens[i]), t))
    for rows in tasks:
        rows.sort()
    return tasks

"""Does a Slurm request fit the cluster? Asked before anything is submitted.

A job that asks for more CPUs, GPUs or memory per node than any node of its partition has, or for more time
than the partition allows, is accepted by sbatch and then stays PENDING forever (reason PartitionConfig or
Resources): `extract --wait` would watch it without end. `check_request_fits` reads the partition's nodes with
`sinfo` and raises a ConfigError naming the setting, the largest node and the value that fits.

What it does not judge (it says nothing rather than guess): constraints, reservations, account and QOS
limits, and any resource that `slurm.additional_sbatch` sets itself. Without `sinfo`, or when it fails, the
check is skipped: sbatch remains the judge.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from eagle_batch import environment
from eagle_batch.config import ConfigError

# sbatch options in slurm.additional_sbatch that change what this check compares: it then stays out.
_OVERRIDES = {
    "partition",
    "p",
    "gres",
    "gpus",
    "gpus-per-node",
    "G",
    "cpus-per-task",
    "c",
    "mem",
    "mem-per-cpu",
    "mem-per-gpu",
    "time",
    "t",
    "nodelist",
    "w",
    "clusters",
    "M",
}


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int

    def describe(self) -> str:
        return f"{self.name}: {self.cpus} CPUs, {self.gpus} GPUs, {self.mem_mb} MB"


@dataclass
class Partition:
    name: str
    default: bool
    max_time_min: int | None  # None: no limit
    nodes: list[Node]


def gres_gpus(gres: str) -> int:
    """GPUs in a node's Gres string: 'gpu:8', 'gpu:h100:4(S:0-1),shard:8' -> 8, 4; '(null)' -> 0."""
    return sum(int(m) for m in re.findall(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", gres))


def time_minutes(limit: str) -> int | None:
    """Slurm's time limit text ('infinite', '1-00:00:00', '4:00:00', '30:00') in minutes; None: no limit."""
    limit = limit.strip()
    if not limit or limit.lower() in ("infinite", "unlimited", "n/a", "none"):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    h, m, s = ([0, 0] + parts)[-3:] if len(parts) > 1 else (0, parts[0], 0)
    return (int(days) if days else 0) * 1440 + h * 60 + m + (1 if s else 0)


def parse_sinfo(text: str) -> dict[str, Partition]:
    """`sinfo -h -N -o '%P|%N|%c|%m|%G|%l'` -> {partition: Partition}; lines that do not parse are left out."""
    parts: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        pname, node, cpus, mem, gres, limit = fields
        try:
            n = Node(node, int(cpus.rstrip("+")), int(mem.rstrip("+")), gres_gpus(gres))
            max_time = time_minutes(limit)
        except ValueError:
            continue
        default = pname.endswith("*")
        p = parts.setdefault(pname.rstrip("*"), Partition(pname.rstrip("*"), default, max_time, []))
        p.nodes.append(n)
    return parts


def read_partitions(timeout_s: float = 30.0) -> dict[str, Partition] | None:
    """The cluster's partitions from sinfo, or None when sinfo is not there or fails."""
    try:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%P|%N|%c|%m|%G|%l"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_sinfo(r.stdout) if r.returncode == 0 else None


def request_problems(
    sc, partitions: dict[str, Partition], sbatch_options: set[str], env_partition: str = "", tasks_per_node: int = 1
) -> list[str]:
    """What in slurm section `sc` cannot be met by `partitions` (one sentence each, with the fix).
    `env_partition` is SBATCH_PARTITION: where sbatch sends a job whose config names no partition;
    `tasks_per_node` processes per node each get slurm.cpus_per_task CPUs (training: one rank per GPU)."""
    if not partitions or sbatch_options & _OVERRIDES:
        return []
    name = sc.partition or env_partition.split(",")[0]
    if name:
        if name not in partitions:
            key = "slurm.partition" if sc.partition else "SBATCH_PARTITION (the environment)"
            return [
                f"{key}={name}: the cluster has no such partition (it has "
                f"{', '.join(sorted(partitions))}); set slurm.partition to one of them."
            ]
        part = partitions[name]
    else:
        part = next((p for p in partitions.values() if p.default), None)
        if part is None:
            return []  # no default partition: sbatch asks for one itself
    problems = []
    if part.max_time_min is not None and sc.time_min > part.max_time_min:
        problems.append(
            f"slurm.time_min={sc.time_min} is more than partition {part.name} allows ({part.max_time_min} min); "
            f"set slurm.time_min={part.max_time_min} or less (a task checkpoints and is requeued at its time limit)."
        )
    mem_mb, cpus = sc.mem_gb * 1024, sc.cpus_per_task * tasks_per_node
    fits = [
        n for n in part.nodes if n.cpus >= cpus and n.gpus >= sc.gpus_per_node and (not mem_mb or n.mem_mb >= mem_mb)
    ]
    if len(fits) >= sc.nodes:
        return problems
    largest = max(part.nodes, key=lambda n: (n.gpus, n.cpus, n.mem_mb))
    most_cpus, most_gpus = max(n.cpus for n in part.nodes), max(n.gpus for n in part.nodes)
    most_gb = max(n.mem_mb for n in part.nodes) // 1024
    per = f" x {tasks_per_node} ranks per node = {cpus}" if tasks_per_node > 1 else ""
    asks = [  # (asked, the most a node has, the text, the value that fits)
        (cpus, most_cpus, f"slurm.cpus_per_task={sc.cpus_per_task}{per} (the most any node has: {most_cpus} CPUs",
         f"slurm.cpus_per_task={most_cpus // tasks_per_node}"),
        (sc.gpus_per_node, most_gpus, f"slurm.gpus_per_node={sc.gpus_per_node} (the most any node has: {most_gpus} GPUs",
         f"slurm.gpus_per_node={most_gpus}"),
        (sc.mem_gb, most_gb, f"slurm.mem_gb={sc.mem_gb} (the most any node has: {most_gb} GB of memory",
         f"slurm.mem_gb={most_gb}"),
    ]  # fmt: skip
    over = [f"{text}; set {fix} or less)" for want, most, text, fix in asks if want > most]
    if over:
        what = "; ".join(over)
    elif fits:
        what = f"set slurm.nodes={len(fits)} or less, or ask for less per node"
    else:
        what = "no single node has all of them at once"
    have = "no node has" if not fits else f"only {len(fits)} node(s) have"
    problems.append(
        f"in partition {part.name} {have} {cpus} CPUs, {sc.gpus_per_node} GPUs"
        f"{f' and {sc.mem_gb} GB of memory' if sc.mem_gb else ''} (the job asks for {sc.nodes} such node(s)): "
        f"{what}. Its largest node is {largest.describe()}; such a job would stay pending forever."
    )
    return problems


def check_request_fits(sc, sbatch_options: set[str], tasks_per_node: int = 1) -> None:
    """ConfigError when slurm section `sc` asks for what its partition cannot give (see the module doc)."""
    partitions = read_partitions()
    problems = request_problems(sc, partitions or {}, sbatch_options, environment.sbatch_partition(), tasks_per_node)
    if problems:
        raise ConfigError(" ".join(problems) + " Nothing was submitted.")

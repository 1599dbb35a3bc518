"""A Slurm request no node of its partition can meet is refused before submission, naming the setting."""

from __future__ import annotations

from dataclasses import replace

import pytest

from eagle_batch.config import SlurmConfig
from eagle_batch.launch.slurm_fit import gres_gpus, parse_sinfo, request_problems, time_minutes

# `sinfo -h -N -o '%P|%N|%c|%m|%G|%l'` of a small cluster: a default CPU partition and a GPU one.
SINFO = """cpu*|c01|64|256000|(null)|1-00:00:00
cpu*|c02|64|256000|(null)|1-00:00:00
gpu|g01|96|2000000|gpu:h200:8(S:0-1)|2:00:00
gpu|g02|48|3000000|gpu:4,shard:16|2:00:00
"""


def test_sinfo_fields_parse():
    assert gres_gpus("gpu:h200:8(S:0-1)") == 8 and gres_gpus("gpu:4,shard:16") == 4 and gres_gpus("(null)") == 0
    assert [time_minutes(t) for t in ("infinite", "1-00:00:00", "2:00:00", "30:00", "45", "0:30:01")] == [
        None, 1440, 120, 30, 45, 31,
    ]  # fmt: skip
    parts = parse_sinfo(SINFO + "garbage line\n")
    assert sorted(parts) == ["cpu", "gpu"] and parts["cpu"].default and not parts["gpu"].default
    assert [(n.name, n.cpus, n.gpus) for n in parts["gpu"].nodes] == [("g01", 96, 8), ("g02", 48, 4)]


@pytest.mark.parametrize(
    "settings, expected",
    [
        (dict(partition="gpu", gpus_per_node=8, cpus_per_task=96, time_min=120), None),
        (dict(partition="gpu", gpus_per_node=4, cpus_per_task=48, time_min=60, nodes=2), None),
        (dict(gpus_per_node=0, cpus_per_task=64, time_min=600), None),  # the default partition
        (
            dict(partition="h100", gpus_per_node=8),
            "slurm.partition=h100: the cluster has no such partition (it has cpu, gpu)",
        ),
        (
            dict(partition="gpu", gpus_per_node=8, cpus_per_task=32, time_min=240),
            "slurm.time_min=240 is more than partition gpu allows (120 min); set slurm.time_min=120 or less",
        ),
        (
            dict(partition="gpu", gpus_per_node=16, cpus_per_task=32, time_min=60),
            "in partition gpu no node has 32 CPUs, 16 GPUs (the job asks for 1 such node(s)): "
            "slurm.gpus_per_node=16 (the most any node has: 8 GPUs; set slurm.gpus_per_node=8 or less)",
        ),
        (
            dict(partition="gpu", gpus_per_node=8, cpus_per_task=32, time_min=60, nodes=2),
            "in partition gpu only 1 node(s) have 32 CPUs, 8 GPUs (the job asks for 2 such node(s)): "
            "set slurm.nodes=1 or less, or ask for less per node. Its largest node is g01: 96 CPUs, 8 GPUs, 2000000 MB",
        ),
        (dict(gpus_per_node=1, cpus_per_task=8, time_min=60), "slurm.gpus_per_node=1 (the most any node has: 0 GPUs"),
        (
            dict(partition="gpu", gpus_per_node=4, cpus_per_task=64, mem_gb=2500, time_min=60),
            "in partition gpu no node has 64 CPUs, 4 GPUs and 2500 GB of memory (the job asks for 1 such node(s)): "
            "no single node has all of them at once",
        ),
    ],
)
def test_requests_that_cannot_be_met_are_named(settings, expected):
    sc = replace(SlurmConfig(), **settings)
    problems = " ".join(request_problems(sc, parse_sinfo(SINFO), set()))
    if expected is None:
        assert problems == ""
    else:
        assert expected in problems


def test_the_check_stays_out_of_what_additional_sbatch_sets_or_sinfo_cannot_say():
    sc = replace(SlurmConfig(), partition="gpu", gpus_per_node=16)
    assert request_problems(sc, parse_sinfo(SINFO), {"gres"}) == []  # --gres=... in slurm.additional_sbatch
    assert request_problems(sc, {}, set()) == []  # no sinfo: sbatch judges
    no_default = parse_sinfo(SINFO.replace("cpu*", "cpu"))
    assert request_problems(replace(SlurmConfig(), gpus_per_node=99), no_default, set()) == []


def test_the_partition_sbatch_takes_from_the_environment_is_the_one_checked():
    sc = replace(SlurmConfig(), gpus_per_node=8, cpus_per_task=96, time_min=60)
    parts = parse_sinfo(SINFO)
    assert "in partition cpu no node has" in " ".join(request_problems(sc, parts, set()))  # the default one
    assert request_problems(sc, parts, set(), env_partition="gpu") == []  # SBATCH_PARTITION=gpu
    assert "SBATCH_PARTITION (the environment)=h200: the cluster has no such partition" in " ".join(
        request_problems(sc, parts, set(), env_partition="h200")
    )


def test_training_ranks_each_get_the_cpus_per_task():
    # A training job runs one rank per GPU, each with slurm.cpus_per_task CPUs: 8 x 16 = 128 > 96.
    sc = replace(SlurmConfig(), partition="gpu", gpus_per_node=8, cpus_per_task=16, time_min=60)
    assert request_problems(sc, parse_sinfo(SINFO), set()) == []
    (problem,) = request_problems(sc, parse_sinfo(SINFO), set(), tasks_per_node=8)
    assert "in partition gpu no node has 128 CPUs, 8 GPUs" in problem
    assert (
        "slurm.cpus_per_task=16 x 8 ranks per node = 128 (the most any node has: 96 CPUs; set slurm.cpus_per_task=12 or less)"
        in problem
    )

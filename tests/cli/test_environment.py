"""The process environment eagle-batch reads and sets (eagle_batch/environment.py)."""

from __future__ import annotations

import os

from eagle_batch import environment


def test_a_cpu_engine_gets_a_kv_cache_that_leaves_the_machine_room(monkeypatch):
    assert environment.cpu_kv_cache_gib(24 << 30) == 4  # a quarter of 24 GiB is 6: capped at 4
    assert environment.cpu_kv_cache_gib(8 << 30) == 2
    assert environment.cpu_kv_cache_gib(1 << 30) == 1  # never below 1 GiB
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert environment.set_cpu_kv_cache_default(on_gpu=True) is None  # GPUs size their own cache
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    gib = environment.set_cpu_kv_cache_default(on_gpu=False)
    assert gib is not None and 1 <= int(gib) <= 4 and os.environ["VLLM_CPU_KVCACHE_SPACE"] == gib
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")  # the user's own value wins
    assert environment.set_cpu_kv_cache_default(on_gpu=False) is None
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "7"


def test_slurm_identity_and_requeue_folder_come_from_slurm_variables():
    job = environment.slurm_job({"SLURM_ARRAY_JOB_ID": "41", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "44"})
    assert job.inside and job.task_job_id == "41_3" and job.restart_count == 0
    assert not environment.slurm_job({}).inside
    assert environment.host_requeue_dir({environment.HOST_REQUEUE: "/r"}) is None  # only inside a job
    assert str(environment.host_requeue_dir({environment.HOST_REQUEUE: "/r", "SLURM_JOB_ID": "1"})) == "/r"
    assert environment.cuda_visible_devices({"CUDA_VISIBLE_DEVICES": "2,3,-1,4"}) == ["2", "3"]
    assert environment.cuda_visible_devices({}) is None

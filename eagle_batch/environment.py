"""The process environment, read in one place.

eagle-batch's settings live in the config (`eagle_batch.config`); the environment only carries what the
scheduler, the launcher or the machine tells a process about itself:

- Slurm (`SLURM_JOB_ID`, `SLURM_ARRAY_JOB_ID`, `SLURM_ARRAY_TASK_ID`, `SLURM_RESTART_COUNT`): which job
  this process is, set by Slurm in every job step.
- torch.distributed ranks (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`): set by submitit's
  `TorchDistributedEnvironment`, torchrun, or `launch.local_train.run_local` for its ranks.
- `EAGLE_BATCH_DIST_INIT`: the file rendezvous `run_local` hands its ranks (a `file://` URL).
- `EAGLE_BATCH_HOST_REQUEUE`: set by the batch script launch.submit writes for container runtimes; the
  folder where a task inside the container asks the host to requeue its job (no `scontrol` inside).
- `EAGLE_BATCH_CACHE`: where converted models and benchmark inputs are cached (default
  ~/.cache/eagle-batch); the shipped configs read it too, through omegaconf's `oc.env`.
- `CUDA_VISIBLE_DEVICES`: the GPUs this process may use (the local executor hands them out).
- `SBATCH_PARTITION`: the partition sbatch submits to when the config names none (sbatch reads it; the
  check that a request fits its partition must look at the same one).
- `VLLM_ENABLE_V1_MULTIPROCESSING`, `VLLM_USE_V2_MODEL_RUNNER`, `VLLM_CPU_KVCACHE_SPACE`: vLLM's own
  switches (engine core in a separate process; which model runner; a CPU engine's KV cache), set before an
  engine starts unless the user set them.
- `EB_BENCH_DIR`: where `bench slurm` makes its temporary run folder (default /tmp; it must be on a
  filesystem the Slurm nodes see).
- Child processes (engines, task processes, benchmark children) start from a copy of this environment
  (`child_environment`), with what they need added.

Nothing else in the package reads `os.environ` for a setting of its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DIST_INIT = "EAGLE_BATCH_DIST_INIT"
HOST_REQUEUE = "EAGLE_BATCH_HOST_REQUEUE"
CACHE = "EAGLE_BATCH_CACHE"


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


@dataclass(frozen=True)
class SlurmJob:
    """What Slurm says about this process (all empty outside a Slurm job)."""

    job_id: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    restart_count: int = 0

    @property
    def inside(self) -> bool:
        return bool(self.job_id or self.array_job_id)

    @property
    def task_job_id(self) -> str:
        """The id `sacct` shows for this task: ARRAY_INDEX for array tasks, else the job id."""
        if self.array_job_id:
            return f"{self.array_job_id}_{self.array_task_id or '0'}"
        return self.job_id


def slurm_job(environ: Mapping[str, str] | None = None) -> SlurmJob:
    e = _env(environ)
    return SlurmJob(
        job_id=e.get("SLURM_JOB_ID", ""),
        array_job_id=e.get("SLURM_ARRAY_JOB_ID", ""),
        array_task_id=e.get("SLURM_ARRAY_TASK_ID", ""),
        restart_count=int(e.get("SLURM_RESTART_COUNT", "0") or 0),
    )


@dataclass(frozen=True)
class DistRanks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    init_method: str = ""  # a file:// rendezvous (run_local), else "" for env:// (torchrun, Slurm)


def dist_ranks(environ: Mapping[str, str] | None = None) -> DistRanks:
    e = _env(environ)
    return DistRanks(
        rank=int(e.get("RANK", 0)),
        world_size=int(e.get("WORLD_SIZE", 1)),
        local_rank=int(e.get("LOCAL_RANK", 0)),
        init_method=e.get(DIST_INIT, ""),
    )


def rank_environment(rank: int, world_size: int, rendezvous: str) -> dict[str, str]:
    """The variables `run_local` sets in each of its rank processes (read back by `dist_ranks`)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        DIST_INIT: f"file://{rendezvous}",
    }


def host_requeue_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The folder to leave a requeue request in when the batch script (on the host) requeues, else None."""
    e = _env(environ)
    d = e.get(HOST_REQUEUE, "")
    return Path(d) if d and e.get("SLURM_JOB_ID") else None


def host_requeue_requested_at_submit(environ: Mapping[str, str] | None = None) -> bool:
    """True when the submitting shell asks for host-side requeues even without a container (tests)."""
    return bool(_env(environ).get(HOST_REQUEUE))


def sbatch_partition(environ: Mapping[str, str] | None = None) -> str:
    """The partition sbatch takes from the environment when none is asked for ("" when none is set)."""
    return _env(environ).get("SBATCH_PARTITION", "").strip()


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    return Path(_env(environ).get(CACHE) or Path.home() / ".cache" / "eagle-batch")


# The caches whose contents are imported or loaded as code: compiled kernels and graphs, and the modules of
# remote code (container/cache-env.sh points them all under EAGLE_BATCH_CACHE).
CODE_CACHES = (
    CACHE,
    "VLLM_CACHE_ROOT",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "FLASHINFER_WORKSPACE_BASE",
    "TORCH_EXTENSIONS_DIR",
    "TVM_FFI_CACHE_DIR",
    "HF_HOME",
    "HF_MODULES_CACHE",
)


def code_caches(environ: Mapping[str, str] | None = None) -> dict[str, Path]:
    """{variable: folder} of the code caches this process was pointed at (eagle-batch's own by default)."""
    e = _env(environ)
    out = {name: Path(e[name]) for name in CODE_CACHES if e.get(name)}
    out.setdefault(CACHE, cache_dir(environ))
    return out


def cuda_visible_devices(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES up to the first invalid one (as CUDA reads it); None if unset."""
    cvd = _env(environ).get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return None
    out = []
    for d in (x.strip() for x in cvd.split(",")):
        if not d or d == "-1":  # CUDA stops at the first invalid entry; "-1" (or "") hides every device
            break
        out.append(d)
    return out


def vllm_multiprocessing(environ: Mapping[str, str] | None = None) -> bool:
    """vLLM's engine core in a process of its own (its default) unless VLLM_ENABLE_V1_MULTIPROCESSING is off."""
    return _env(environ).get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") not in ("0", "false", "False")


def set_vllm_multiprocessing_default(enabled: bool) -> None:
    """Choose where vLLM runs its engine core, unless the user set VLLM_ENABLE_V1_MULTIPROCESSING (wins)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if enabled else "0")


# vLLM on the CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB); unset, it asks for
# gpu_memory_utilization of the machine's whole memory (0.85 by default), which fails at start, or gets the
# engine OOM-killed later, whenever anything else runs beside it. Capture prompts need little KV cache.
CPU_KV_CACHE_MAX_GIB = 4
CPU_KV_CACHE_SHARE = 0.25


def cpu_kv_cache_gib(available_bytes: int) -> int:
    """The KV cache eagle-batch gives a CPU engine: a quarter of the available memory, 1 to 4 GiB."""
    return int(max(1, min(CPU_KV_CACHE_MAX_GIB, CPU_KV_CACHE_SHARE * available_bytes / (1 << 30))))


def set_cpu_kv_cache_default(on_gpu: bool) -> str | None:
    """Before a vLLM engine starts on the CPU: VLLM_CPU_KVCACHE_SPACE unless the user set it. Returns what
    was set (for the log), or None when nothing was (a GPU, or the user's own value)."""
    if on_gpu or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        available = 4 << 30
    gib = str(cpu_kv_cache_gib(available))
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = gib
    return gib


def use_v1_model_runner() -> None:
    """vLLM's V1 model runner (where the hooks backend reads the batch layout), unless the user chose."""
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")


def set_offline_defaults(**extra: str) -> None:
    """Defaults for processes that load tokenizers or models: never reach a model hub, no tokenizer thread
    pool fighting the data workers; `extra` adds more (a user's own setting of any of them wins)."""
    for key, value in {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}.items():
        os.environ.setdefault(key, value)


def child_environment(extra: Mapping[str, str] | None = None, drop_prefix: str = "") -> dict[str, str]:
    """A copy of this process's environment for a child process: `extra` added (it wins), and every variable
    whose name starts with `drop_prefix` (when given) left out."""
    env = {k: v for k, v in os.environ.items() if not (drop_prefix and k.startswith(drop_prefix))}
    env.update(extra or {})
    return env


def child_pythonpath(env: dict[str, str], first: str) -> dict[str, str]:
    """`env` with `first` put before its PYTHONPATH (a child that must import this eagle_batch)."""
    env["PYTHONPATH"] = os.pathsep.join([first, env.get("PYTHONPATH", "")])
    return env


def set_variables(values: Mapping[str, str]) -> None:
    """Set variables in this process's environment (a rank's ranks, a child's vLLM switch): what this
    process and the children it starts afterwards read."""
    os.environ.update(values)


def set_vllm_multiprocessing(enabled: bool) -> None:
    """Run vLLM's engine core in a process of its own (or not), whatever the environment said."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if enabled else "0"


def bench_dir(environ: Mapping[str, str] | None = None) -> str:
    """EB_BENCH_DIR: where `bench slurm` makes its temporary run folder (default /tmp)."""
    return _env(environ).get("EB_BENCH_DIR", "/tmp")

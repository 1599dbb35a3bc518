"""The single-machine executor: extraction tasks on this machine through submitit's LocalExecutor.

Used for `slurm.executor=local` (and `auto` where no Slurm controller answers): a workstation or one
GPU box. It keeps the promises of the Slurm path:

- **GPUs.** The devices this process may use (`CUDA_VISIBLE_DEVICES`, else every GPU `nvidia-smi -L`
  lists) are split into groups of `slurm.gpus_per_node`; each group is a *slot* that runs tasks one after
  another, and slots run side by side (at most `slurm.array_parallelism`). A task sees exactly its slot's
  devices in `CUDA_VISIBLE_DEVICES`. Asking more GPUs per task than the machine has is refused before
  anything starts. On a machine without GPUs (or with `slurm.gpus_per_node=0`) one slot runs the tasks on
  the CPU, one at a time (each task runs its own engine; two would compete for the same memory). A slot
  holds its devices through a lock file per device in the machine's temp folder, so a second local job
  (a `resume`, another run) waits for them instead of sharing a GPU; `slurm.share_devices=true` lets a
  run's slots skip the locks (engines small enough to share a GPU, each within its memory share), and
  with it `slurm.tasks_per_gpu_group=K` puts K slots on each group (a small model's engine is bound by
  the host, so K side by side on one GPU do more than one).
- **One process per task.** A slot is one submitit LocalExecutor job (its log, its pickled result). It
  claims the next unclaimed task and runs it in a child process, so a task that is killed (the
  out-of-memory killer, `kill -9`) is reaped at once, its exit is recorded, and the slot goes on with the
  next task; every task also starts its engine in a fresh process (GPU memory is freed between tasks).
  The child leads a process group of its own, and when it ends whatever it started (vLLM's engine core and
  workers outlive a killed task, holding the GPU) is ended too, as Slurm ends a job step's processes.
- **Limits and retries as on Slurm.** `slurm.time_min` is each task's limit: every process of the task
  (its process group, as Slurm signals every process of a step) gets SIGUSR2 `slurm.signal_delay_s` before
  it, the task commits and stops, and the slot runs it again from its commits (at
  most `slurm.max_num_timeout` times). A task that raised runs again while it has fewer than
  `slurm.max_attempts` failures. A killed task is not retried: it would most likely be killed again;
  `status` shows it as failed with the signal, and `resume` reruns it.
- **State on disk.** Everything `status` needs lives in the submission's folder RUN/slurm/local-ID/:

      slots.json         [{slot, pid, ticks, devices}] the slot jobs' controller processes (by the CLI)
      slot-PID.json      {pid, ticks} of a slot's own process, once it runs (by the slot)
      claim-TTTTT        task T was taken by a slot (O_EXCL: exactly one slot runs each task)
      exit-TTTTT.json    {rc, signal, ended} of the task's last process (by the slot, after it ended)
      task-TTTTT.log     the task's stdout and stderr, every attempt appended
      cancelled          `eagle-batch cancel` stopped this submission

  A process is alive when its (pid, start time) still runs and is not a zombie (`proc.alive`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle_batch import environment
from eagle_batch.ownership import user_temp_dir

from . import proc
from . import state as S
from .submitit_local import detached_executor

SLOTS = "slots.json"
CANCELLED = "cancelled"
# submitit's own limit on a slot job: none in practice; each task's limit is enforced by the slot.
SLOT_JOB_TIMEOUT_MIN = 60 * 24 * 365
KILL_GRACE_S = 30.0


class LocalResourceError(ValueError):
    """The config asks for more than this machine has; the message names the key and the fix."""


def visible_gpus(environ: dict | None = None) -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES's entries, else `nvidia-smi -L`'s (else
    the /dev/nvidiaN device files)."""
    listed = environment.cuda_visible_devices(environ)
    if listed is not None:
        return listed
    smi = shutil.which("nvidia-smi")
    n = -1
    if smi is not None:
        try:
            r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                n = sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.TimeoutExpired):
            pass
    if n < 0:  # no nvidia-smi (a minimal container): the driver's device files
        n = sum(1 for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())
    return [str(i) for i in range(n)]


@dataclass
class SlotPlan:
    devices: list[list[str]]  # one entry per slot: the devices its tasks see ([] = CPU)
    note: str  # what the user should know about the choice ("" when the config got what it asked)


def plan_slots(
    devices: Sequence[str],
    gpus_per_task: int,
    max_parallel: int,
    num_tasks: int,
    tensor_parallel: int = 1,
    per_group: int = 1,
) -> SlotPlan:
    """Split `devices` into groups of `gpus_per_task` GPUs, `per_group` slots on each (slots k and k + groups
    share a group), spread over the groups first; raise LocalResourceError if one slot cannot fit."""
    devices = list(devices)
    if gpus_per_task <= 0:
        return SlotPlan([[]], "slurm.gpus_per_node=0: the tasks run on the CPU, one at a time")
    if not devices:
        return SlotPlan(
            [[]],
            f"no GPU is visible here (CUDA_VISIBLE_DEVICES unset and nvidia-smi lists none), "
            f"so slurm.gpus_per_node={gpus_per_task} is ignored: the tasks run on the CPU, "
            "one at a time",
        )
    if gpus_per_task > len(devices):
        raise LocalResourceError(
            f"slurm.gpus_per_node={gpus_per_task} asks for {gpus_per_task} GPUs per task but this machine has "
            f"{len(devices)} ({', '.join(devices)}); set slurm.gpus_per_node={len(devices)} or fewer"
            + (
                f" (model.tensor_parallel_size={tensor_parallel} needs at least {tensor_parallel})"
                if tensor_parallel > 1
                else ""
            )
            + "."
        )
    avail = len(devices) // gpus_per_task
    n = max(1, min(avail * max(1, per_group), max(1, max_parallel), max(1, num_tasks)))
    groups = [devices[(k % avail) * gpus_per_task : (k % avail + 1) * gpus_per_task] for k in range(n)]
    spare = len(devices) - min(n, avail) * gpus_per_task
    note = f"{spare} GPU(s) left idle" if spare and n < max_parallel and n < num_tasks else ""
    return SlotPlan(groups, note)


# ------------------------------------------------------------------------------------ submission folder
def submission_dir(run_dir: str | os.PathLike, job_id: str) -> Path:
    return Path(run_dir) / S.SLURM_DIR / job_id


def task_log(sub_dir: Path, task_id: int) -> Path:
    return sub_dir / f"task-{task_id:05d}.log"


def _exit_path(sub_dir: Path, task_id: int) -> Path:
    return sub_dir / f"exit-{task_id:05d}.json"


def _claim(sub_dir: Path, task_id: int) -> bool:
    try:
        os.close(os.open(sub_dir / f"claim-{task_id:05d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        return False


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def submission_alive(sub_dir: Path) -> bool:
    """Is any slot of this submission still running (its controller, or the slot process itself)?"""
    procs = list(_read_json(sub_dir / SLOTS) or [])
    procs += [_read_json(p) or {} for p in sub_dir.glob("slot-*.json")]
    return any(proc.alive(int(p.get("pid", 0)), int(p.get("ticks", 0))) for p in procs)


def task_exit(sub_dir: Path, task_id: int) -> dict | None:
    """{rc, signal, ended} of the task's last process in this submission, if one ended."""
    return _read_json(_exit_path(sub_dir, task_id))


def claimed(sub_dir: Path, task_id: int) -> bool:
    return (sub_dir / f"claim-{task_id:05d}").exists()


def cancelled(sub_dir: Path) -> bool:
    return (sub_dir / CANCELLED).exists()


def exit_message(ex: dict) -> str:
    sig = ex.get("signal")
    if sig:
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        why = " (the out-of-memory killer, or kill -9)" if sig == signal.SIGKILL else ""
        return f"the task's process was killed by {name}{why}"
    return f"the task's process exited with status {ex.get('rc')}"


# ------------------------------------------------------------------------------------------ submitting
def submit_local(cfg, run_dir: Path, task_ids: Sequence[int], kind: str) -> S.Submission:
    """Start one slot job per GPU group; each claims and runs `task_ids` in order (LocalResourceError when
    a task would need more GPUs than the machine has)."""
    sc = cfg.slurm
    per_group = sc.tasks_per_gpu_group if sc.share_devices else 1
    plan = plan_slots(
        visible_gpus(),
        sc.gpus_per_node,
        sc.array_parallelism,
        len(task_ids),
        cfg.model.tensor_parallel_size,
        per_group,
    )
    t0 = time.time()
    job_id = f"local-{int(t0)}-{os.getpid()}"
    S.slurm_dir(run_dir)  # 0700: the slot files hold the pids `cancel` signals
    sub_dir = submission_dir(run_dir, job_id)
    sub_dir.mkdir(exist_ok=False)
    slots = []
    for k, devices in enumerate(plan.devices):
        ex = detached_executor(sub_dir, SLOT_JOB_TIMEOUT_MIN)  # slot logs: PID_0_log.{out,err}
        job = ex.submit(
            run_slot,
            str(run_dir),
            str(sub_dir),
            job_id,
            list(task_ids),
            devices,
            _SlotLimits.from_config(sc),
            bool(sc.share_devices),
        )
        pid = int(job.job_id)
        slots.append(
            {"slot": k, "pid": pid, "ticks": proc.start_ticks(pid), "devices": devices, "log": str(job.paths.stderr)}
        )
    _write_json(sub_dir / SLOTS, slots)
    return S.Submission(
        job_id=job_id,
        executor="local",
        tasks=sorted(task_ids),
        time=t0,
        kind=kind,
        folder=str(sub_dir),
        array=False,
        note=plan.note,
        devices=[",".join(d) for d in plan.devices],
    )


def local_summary(sub: S.Submission) -> str:
    """One line for the CLI: where the tasks of a local submission run."""
    where = "; ".join(f"slot {k}: GPUs {d}" if d else f"slot {k}: CPU" for k, d in enumerate(sub.devices))
    return (
        f"executor: local (submitit LocalExecutor on this machine), job {sub.job_id}: {len(sub.tasks)} "
        f"task(s), one after another per slot ({where})" + (f"; {sub.note}" if sub.note else "")
    )


# ---------------------------------------------------------------------------------------------- a slot
@dataclass
class _SlotLimits:
    time_s: float  # each attempt's wall-clock limit
    signal_delay_s: float  # SIGUSR2 this long before the limit
    max_num_timeout: int  # reruns after a checkpoint at the limit
    max_attempts: int  # attempts that raise before the task gives up

    @classmethod
    def from_config(cls, sc) -> "_SlotLimits":
        return cls(
            time_s=60.0 * sc.time_min,
            signal_delay_s=float(sc.signal_delay_s),
            max_num_timeout=int(sc.max_num_timeout),
            max_attempts=int(sc.max_attempts),
        )


def _task_env(devices: list[str]) -> dict:
    env = environment.child_environment(drop_prefix="SUBMITIT_")  # the task is no submitit job
    env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    return env


def run_slot(
    run_dir: str,
    sub_dir: str,
    job_id: str,
    task_ids: list[int],
    devices: list[str],
    limits: _SlotLimits,
    share_devices: bool = False,
) -> dict:
    """The slot job (runs inside submitit's local job): claim tasks, run each in a child process, holding
    the slot's devices while it does (unless `share_devices`: slurm.share_devices)."""
    sub = Path(sub_dir)
    me = {"pid": os.getpid(), "ticks": proc.start_ticks(os.getpid()), "devices": devices}
    _write_json(sub / f"slot-{os.getpid()}.json", me)
    stopping = {"signal": 0}
    child: dict = {"p": None}

    def forward(signum, frame):  # cancel / submitit's own signals: pass them on, start nothing new
        stopping["signal"] = signum
        p = child["p"]
        if p is not None and p.poll() is None:
            if signum == signal.SIGUSR2:
                _signal_group(p.pid, signum)  # the checkpoint signal, to every process of the task
            else:
                p.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):  # SIGINT: submitit's LocalJob.cancel()
        signal.signal(s, forward)
    results: dict[int, str] = {}
    for t in task_ids:
        if stopping["signal"]:
            break
        if not _claim(sub, t):
            continue
        with contextlib.nullcontext(True) if share_devices else _hold_devices(devices, stopping) as held:
            if held:
                results[t] = _run_task(run_dir, sub, job_id, t, devices, limits, child, stopping)
    return {"job_id": job_id, "tasks": results}


def _run_task(
    run_dir: str, sub: Path, job_id: str, t: int, devices: list[str], limits: _SlotLimits, child: dict, stopping: dict
) -> str:
    """Attempts of task `t` until it is done, gives up, is killed or the slot is stopped; its last status."""
    timeouts = 0
    while True:
        rc = _run_attempt(run_dir, sub, f"{job_id}_{t}", t, devices, limits, child, stopping)
        try:
            _write_json(_exit_path(sub, t), {"rc": rc, "signal": -rc if rc < 0 else 0, "ended": time.time()})
        except OSError:  # a full disk: the task's own state file (written from its reserve) says what happened
            pass
        st = S.read_state(run_dir, t)
        if st is None or stopping["signal"] or rc < 0:
            return st.status if st is not None else "not started"
        if st.status == S.CHECKPOINTED and timeouts < limits.max_num_timeout:
            timeouts += 1  # hit its time limit and committed: continue from the commits
        elif not (st.status == S.FAILED and st.failures < limits.max_attempts):
            return st.status
        # else it raised: another attempt, as Slurm's requeue would start one


@contextlib.contextmanager
def _hold_devices(devices: list[str], stopping: dict) -> Iterator[bool]:
    """Exclusive use of `devices` (or of the CPU slot) on this machine, across runs and submissions: a
    `resume` while an earlier local job still runs waits for its GPUs instead of sharing them.
    Yields False when the slot was stopped while waiting."""
    d = user_temp_dir("devices")  # 0700 and ours: never a folder or link another user planted
    fds = []
    try:
        for name in sorted(devices) or ["cpu"]:  # one order everywhere: no two slots wait for each other
            lock = d / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.lock"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            fds.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if stopping["signal"]:
                        yield False
                        return
                    time.sleep(1.0)
        yield True
    finally:
        for fd in fds:
            os.close(fd)


def _run_attempt(
    run_dir: str,
    sub: Path,
    job_id: str,
    task_id: int,
    devices: list[str],
    limits: _SlotLimits,
    child: dict,
    stopping: dict,
) -> int:
    """One attempt in a child process, held to the task's time limit; returns its exit status (-N: signal N)."""
    log = task_log(sub, task_id)
    cmd = [sys.executable, "-u", "-m", "eagle_batch.launch.run_task", run_dir, str(task_id), job_id, str(log)]
    with open(log, "ab") as f:
        # A session of its own: what the task starts (vLLM's engine core and workers) is in its process group,
        # and ends with it (_end_group), as Slurm ends every process of a job step.
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_task_env(devices), start_new_session=True)
        child["p"] = p
        started = time.monotonic()
        warned = False
        end_by: float | None = None  # SIGTERM sent (limit or cancel): SIGKILL after the grace period
        try:
            while True:
                try:
                    return p.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if not warned and now - started >= limits.time_s - limits.signal_delay_s:
                    warned = True
                    f.write(
                        f"[eagle-batch] task {task_id}: the {limits.time_s / 60:g} min limit is "
                        f"{limits.signal_delay_s:g} s away: SIGUSR2 (commit and stop)\n".encode()
                    )
                    f.flush()
                    _signal_group(p.pid, signal.SIGUSR2)  # as Slurm: every process of the task gets it
                if end_by is None and (now - started >= limits.time_s or stopping["signal"]):
                    end_by = now + KILL_GRACE_S
                    if not stopping["signal"]:
                        p.terminate()
                elif end_by is not None and now >= end_by:
                    p.kill()
        finally:
            child["p"] = None
            _end_group(p.pid)


def _signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to every process of the group; False when none is left (the task and all it started)."""
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False


def _end_group(pgid: int, grace_s: float = 10.0) -> None:
    """End whatever is left of a task's process group. A task killed by SIGKILL leaves its engine processes
    running (they hold the GPU's memory, shared memory and ports), and the next attempt's engine would fail
    to start next to them: SIGTERM, then SIGKILL after `grace_s`, and wait until the group is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _signal_group(pgid, sig):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not _signal_group(pgid, 0):
                return
            time.sleep(0.2)

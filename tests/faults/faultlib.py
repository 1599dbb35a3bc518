"""Helpers of the fault-injection suite (tests/faults): a real run (prepare -> ArrayTask with the `hf`
backend on a tiny random Llama in float32 on the CPU -> task store), a way to run one task in a child
process, and a sample-by-sample, bit-exact comparison with an uninterrupted reference run.

Used by the pytest subset (test_*.py here) and the full script (run_all.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "configs" / "data" / "demo-chat.jsonl"

# Small layout: 16-token chunks in 64-token shards, so one task of ~20 demo chats spans dozens of shard
# files and a kill or a full disk lands among many shard writes and commits.
STORE = {"chunk_tokens": 16, "shard_tokens": 64}


def tiny_llama() -> Path:
    from eagle_batch.models.smollm2 import cache_root
    from eagle_batch.models.tiny import build_tiny_model

    return build_tiny_model("llama", cache_root() / "models" / "tiny-llama")


def write_config(path: Path, run: Path, model: Path, num_tasks: int = 1, executor: str = "local", **sections) -> Path:
    cfg = {
        "run_dir": str(run),
        # float32 on the CPU: the hf forward is deterministic, so a resumed task must give the same bits.
        "model": {"path": str(model), "max_model_len": 512, "dtype": "float32"},
        "data": {"inputs": [str(DATA)], "format": "messages", "max_length": 256},
        # One sample per batch and a commit after every batch: many commits for kills to land in.
        "extract": {"num_tasks": num_tasks, "backend": "hf", "batch_samples": 1, "commit_interval_s": 0},
        "store": dict(STORE),
        "slurm": {"executor": executor, "gpus_per_node": 1, "cpus_per_task": 1, "time_min": 10, "max_attempts": 1},
    }
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    path.write_text(json.dumps(cfg))
    return path


def cli(*argv) -> int:
    from eagle_batch.cli import main

    return main([str(a) for a in argv])


def prepared_run(base: Path, name: str = "prepared", num_tasks: int = 1, **sections) -> Path:
    """A run directory with prepared/ and config.yaml (nothing extracted)."""
    run = base / name
    cfg = write_config(base / f"{name}.yaml", run, tiny_llama(), num_tasks, **sections)
    rc = cli("prepare", cfg, "--workers", "1", "--no-progress")
    assert rc == 0, f"prepare failed ({rc})"
    return run


def copy_run(src: Path, dst: Path, what=("config.yaml", "prepared")) -> Path:
    """Copy a run (by default only its config and prepared data) to `dst`, pointing config.yaml at `dst`."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in what:
        s = src / name
        if s.is_dir():
            shutil.copytree(s, dst / name)
        elif s.exists():
            shutil.copy2(s, dst / name)
    cfg = dst / "config.yaml"
    cfg.write_text(cfg.read_text().replace(str(src), str(dst)))
    return dst


CHILD = r"""
import os, sys, torch
torch.set_num_threads(1)
from eagle_batch.launch import ArrayTask
out = ArrayTask(sys.argv[1], int(sys.argv[2]))()
print("RESULT", out, flush=True)
"""


def child_env(**extra) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
    )
    for k in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID"):  # a local attempt, never Slurm's
        env.pop(k, None)
    env.update(extra)
    return env


def spawn_task(run: Path, task_id: int = 0, **env) -> subprocess.Popen:
    """The real ArrayTask(run, task_id)() in a child process (what a Slurm array task runs)."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run), str(task_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(**env),
        cwd=str(run),
    )


def run_task(run: Path, task_id: int = 0, timeout: float = 600, **env) -> subprocess.CompletedProcess:
    p = spawn_task(run, task_id, **env)
    out, err = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def store_of(run: Path, task_id: int = 0) -> Path:
    return run / "stores" / f"task-{task_id:05d}.zarr"


def lock_holder_pid(store: Path) -> int | None:
    try:
        return int(json.loads((store / ".lock").read_text() or "{}").get("pid", 0)) or None
    except (OSError, ValueError):
        return None


def committed_samples(store: Path) -> int:
    try:
        return int(json.loads((store / "progress.json").read_text())["num_samples"])
    except (OSError, ValueError, KeyError):
        return 0


def assert_same_store(got: Path, ref: Path) -> int:
    """Sample by sample, bit-exact: ids, input_ids, loss_mask and the bf16 bits of hidden_states. -> samples."""
    from eagle_batch.store import open_dataset

    a, b = open_dataset(got), open_dataset(ref)
    assert len(a) == len(b) > 0, (len(a), len(b))
    for i in range(len(b)):
        x, y = a.get_arrays(i), b.get_arrays(i)
        assert x["sample_id"] == y["sample_id"], (i, x["sample_id"], y["sample_id"])
        for k in ("input_ids", "loss_mask", "hidden_states"):
            assert np.array_equal(np.asarray(x[k]), np.asarray(y[k])), (
                f"{got} sample {i} ({y['sample_id']}): {k} differs"
            )
    assert (got / "complete").is_file()
    return len(b)


def assert_committed_prefix(got: Path, ref: Path) -> int:
    """After a kill or a failed write: the committed record is a prefix of the reference, bit-exact."""
    from eagle_batch.store import open_dataset, verify

    if not (got / "progress.json").is_file():
        return 0
    problems = [p for p in verify(got) if p.kind != "stray"]  # strays are removed by the next open
    assert not problems, "\n".join(map(str, problems))
    a, b = open_dataset(got), open_dataset(ref)
    assert len(a) <= len(b)
    for i in range(len(a)):
        x, y = a.get_arrays(i), b.get_arrays(i)
        assert x["sample_id"] == y["sample_id"]
        for k in ("input_ids", "loss_mask", "hidden_states"):
            assert np.array_equal(np.asarray(x[k]), np.asarray(y[k])), f"{got} sample {i}: {k} differs"
    return len(a)


def kill_at_random_point(run: Path, rng: np.random.Generator, work_s: float, task_id: int = 0) -> tuple[bool, str]:
    """Start the task, wait until it holds its store's lock (engine loaded, store open), SIGKILL it after a
    random delay within the work left; -> (killed, phase) where phase says where the kill was aimed."""
    store = store_of(run, task_id)
    p = spawn_task(run, task_id)
    phase = "capture+write"
    if rng.random() < 0.1:  # sometimes during start-up or store recovery
        time.sleep(rng.uniform(0.0, 3.0))
        phase = "start-up/recovery"
    else:
        t0 = time.monotonic()
        while lock_holder_pid(store) != p.pid and p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, max(0.05, work_s)))
    killed = p.poll() is None
    if killed:
        p.send_signal(signal.SIGKILL)
    out, err = p.communicate()
    assert p.returncode in (0, -signal.SIGKILL), f"task exited {p.returncode}:\n{err[-3000:]}"
    return killed, phase


# ------------------------------------------------------------------------------------ forked tasks
# A fresh interpreter spends ~10-40 s importing torch and transformers on a loaded 2-core machine. The
# kill trials instead fork each attempt from a parent that has imported them (and run one forward, with
# one thread, so fork is safe): the child still runs the whole real ArrayTask (config, prepared samples,
# model load, hf capture, store writer, state file), it only skips the imports.


def preload() -> None:
    import torch

    torch.set_num_threads(1)
    import transformers  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    import eagle_batch.capture.hf  # noqa: F401
    import eagle_batch.data  # noqa: F401
    import eagle_batch.launch  # noqa: F401
    import eagle_batch.store  # noqa: F401


def _own_tqdm_lock() -> None:
    """Give a forked child a tqdm lock of its own. tqdm's class-wide lock holds a multiprocessing semaphore,
    which a fork shares with the parent and every sibling: a child killed (-9) inside a progress bar (the
    model loading's) leaves it taken, and every later child then blocks on its first progress bar. A task
    Slurm or the local executor starts is a process of its own, with its own lock; a forked one must be too."""
    import threading

    from tqdm import std

    lock = threading.RLock()  # not a new TqdmDefaultWriteLock: it would reuse the class's shared semaphore
    classes = [std.tqdm]
    while classes:  # tqdm.auto's class and others keep a lock of their own once they have made one
        cls = classes.pop()
        cls.set_lock(lock)
        classes += cls.__subclasses__()


def fork_task(run: Path, task_id: int = 0, env: dict | None = None) -> int:
    """Fork a child that runs ArrayTask(run, task_id)() and exits 0 (done/checkpointed) or 1 (raised)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            for k in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID"):
                os.environ.pop(k, None)
            os.environ.update(env or {})
            _own_tqdm_lock()
            from eagle_batch.launch import ArrayTask

            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # the progress bars of from_pretrained
            err = os.open(str(run / f"task-{task_id}.child.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(err, 2)
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # not pytest's capture buffer
            ArrayTask(str(run), task_id)()
            code = 0
        except BaseException:  # noqa: BLE001 - the child reports by exit code and its stderr file
            import traceback

            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    return pid


def fork_task_with_disk_budget(run: Path, budget_bytes: int, task_id: int = 0) -> int:
    """fork_task whose child gets ENOSPC once it has written `budget_bytes` through os.write/os.writev (the
    store's only write calls). The patch is in place only around the fork: the child inherits it."""
    left = {"bytes": budget_bytes}
    real_write, real_writev = os.write, os.writev

    def spend(n: int) -> None:
        left["bytes"] -= n
        if left["bytes"] < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_write(fd, data):
        spend(len(data))
        return real_write(fd, data)

    def full_writev(fd, buffers):
        spend(sum(memoryview(b).nbytes for b in buffers))
        return real_writev(fd, buffers)

    os.write, os.writev = full_write, full_writev
    try:
        return fork_task(run, task_id)
    finally:
        os.write, os.writev = real_write, real_writev


def wait_pid(pid: int, timeout: float = 600) -> int:
    """-> exit code, or -signal."""
    t0 = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"task child {pid} ran past {timeout} s")
        time.sleep(0.02)


def child_stderr(run: Path, task_id: int = 0) -> str:
    p = run / f"task-{task_id}.child.err"
    return p.read_text()[-4000:] if p.is_file() else ""


def run_forked(run: Path, task_id: int = 0, env: dict | None = None, timeout: float = 600) -> tuple[int, float]:
    """Run the task to its end in a forked child. -> (exit code, seconds from store lock to exit)."""
    store = store_of(run, task_id)
    pid = fork_task(run, task_id, env)
    t_lock = None
    t0 = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if t_lock is None and lock_holder_pid(store) == pid:
            t_lock = time.monotonic()
        if done:
            return os.waitstatus_to_exitcode(status), time.monotonic() - (t_lock or t0)
        if time.monotonic() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"task child {pid} ran past {timeout} s")
        time.sleep(0.01)


def kill_forked_at_random_point(
    run: Path, rng: np.random.Generator, n_total: int, per_sample_s: float, task_id: int = 0
) -> str:
    """Fork the task and SIGKILL it at a random point of its capture + write: once it holds its store's lock
    (store opened and recovered), wait until a random number of the samples left are committed, then a
    random fraction of one sample's time more (so kills land in forwards, appends, shard writes, commits and
    finalize alike). One kill in ten is aimed at start-up/recovery instead (before or just after the lock).
    -> 'start-up/recovery', 'capture+write', or 'finished' (the task ended before the kill)."""
    store = store_of(run, task_id)
    start = committed_samples(store)
    pid = fork_task(run, task_id)
    if rng.random() < 0.1:
        time.sleep(rng.uniform(0.0, 1.5))
        phase = "start-up/recovery"
    else:
        # kill after this many samples are committed (all of them: a kill in finalize) ...
        target = int(rng.integers(start, n_total + 1)) if start < n_total else n_total
        t0 = time.monotonic()
        while (lock_holder_pid(store) != pid or committed_samples(store) < target) and time.monotonic() - t0 < 300:
            if os.waitpid(pid, os.WNOHANG)[0]:
                raise AssertionError(f"task ended before the kill point:\n{child_stderr(run, task_id)}")
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 1.5 * per_sample_s))  # ... plus part of one more sample's work
        phase = "capture+write"
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        code = os.waitstatus_to_exitcode(status)
        assert code == 0, f"task failed ({code}):\n{child_stderr(run, task_id)}"
        return "finished"
    os.kill(pid, signal.SIGKILL)
    code = wait_pid(pid)
    if code == 0:
        return "finished"
    assert code == -signal.SIGKILL, f"task failed ({code}):\n{child_stderr(run, task_id)}"
    return phase


def kill_trials(
    base: Path, prepared: Path, ref_store: Path, trials: int, kills_per_run: int = 5, seed: int = 0, log=print
) -> dict:
    """`trials` SIGKILLs spread over runs of `kills_per_run` kills each; after every kill the store holds a
    bit-exact committed prefix of the reference; after the final resume it equals the reference."""
    rng = np.random.default_rng(seed)
    probe = copy_run(prepared, base / "kill-probe")
    code, work_s = run_forked(probe)
    assert code == 0, child_stderr(probe)
    assert_same_store(store_of(probe), ref_store)
    log(f"uninterrupted forked task: {work_s:.1f} s from store lock to exit; identical to the reference")
    shutil.rmtree(probe)
    res = {
        "kills": 0,
        "runs": 0,
        "phases": {},
        "committed_at_kill": [],
        "finished_before_kill": 0,
        "samples_compared": 0,
        "data_lost_samples": 0,
        "work_s": round(work_s, 2),
    }
    n_total = len(json.loads((ref_store / "progress.json").read_text())["sample_ids"])
    r = 0
    while res["kills"] < trials:
        run = copy_run(prepared, base / f"kill-{r}")
        at = []
        for _ in range(kills_per_run):
            phase = kill_forked_at_random_point(run, rng, n_total, work_s / n_total)
            if phase == "finished":
                res["finished_before_kill"] += 1
                break
            res["kills"] += 1
            res["phases"][phase] = res["phases"].get(phase, 0) + 1
            n = assert_committed_prefix(store_of(run), ref_store)
            res["committed_at_kill"].append(n)
            at.append(n)
            res["complete_at_kill"] = res.get("complete_at_kill", 0) + (store_of(run) / "complete").is_file()
            if res["kills"] >= trials or (store_of(run) / "complete").is_file():
                break  # a finished store: further kills would only hit its quick re-open
        code, _ = run_forked(run)
        assert code == 0, child_stderr(run)
        res["samples_compared"] += assert_same_store(store_of(run), ref_store)
        st = json.loads((run / "state" / "task-00000.json").read_text())
        assert st["status"] == "done" and st["samples_committed"] == n_total, st
        # Throughput history over all attempts (the demo report plots it): ordered, ends at the total.
        hist = st["extra"]["history"]
        assert hist[-1][1] == st["tokens_committed"] and len(hist) >= 2, hist
        assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(hist, hist[1:])), hist
        log(f"run {r}: committed samples at each kill {at}; resumed store bit-identical to the reference")
        res["runs"] += 1
        shutil.rmtree(run)
        r += 1
    return res


def split_plan(run: Path, num_tasks: int) -> None:
    """Rewrite prepared/plan.json so the run's samples form `num_tasks` contiguous tasks (for one run whose
    tasks each carry a different fault, resumed by one `resume`)."""
    import pyarrow.parquet as pq

    p = run / "prepared" / "plan.json"
    plan = json.loads(p.read_text())
    rows = [r for t in plan["tasks"] for r in t["rows"]]
    ntok = pq.read_table(run / "prepared" / "samples.parquet", columns=["num_tokens"]).column(0).to_pylist()
    parts = np.array_split(np.array(rows), num_tasks)
    plan["num_tasks"] = num_tasks
    plan["tasks"] = [
        {
            "task_id": i,
            "rows": [int(r) for r in part],
            "num_tokens": int(sum(ntok[r] for r in part)),
            "num_samples": len(part),
        }
        for i, part in enumerate(parts)
    ]
    p.write_text(json.dumps(plan))


def mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at `path`; -> None, or why it cannot (not root / no mount permission)."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return "no mount command"
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    return None if r.returncode == 0 else f"cannot mount a tmpfs ({r.stderr.strip() or r.returncode}); needs root"


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)

"""The local executor (launch.local) on this machine, through the CLI a user types.

- tasks see the GPUs the config asks for (`CUDA_VISIBLE_DEVICES` covers `slurm.gpus_per_node` devices,
  slots side by side when the machine has enough), and a config asking for more is refused up front;
- `status` counts what the store committed, also when capture appends whole engine steps (append_block);
- the checkpoint signal before the time limit reaches the task's whole process group, as on Slurm, and
  ends none of the processes the task started;
- a task killed with SIGKILL is `failed` (not `running`), with the signal as its error, even while the
  CLI that started it is still its parent (zombies); `resume` reruns exactly it; `extract --wait` returns
  after the kill and `resume --wait` only once the new attempt is done.

The GPUs are names in CUDA_VISIBLE_DEVICES (this machine has none): what is checked is which device list
each task process receives, which is all the executor decides.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import run_cli

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.slurm import work  # noqa: E402


def make_run(
    tmp_path: Path, num_tasks: int, work_fn: str = "tests.slurm.work:synthetic_work", **slurm
) -> tuple[Path, Path]:
    run = tmp_path / "run"
    (run / "prepared").mkdir(parents=True)
    (run / "faults").mkdir()
    tasks = [
        {
            "task_id": t,
            "rows": list(range(work.N_SAMPLES)),
            "num_samples": work.N_SAMPLES,
            "num_tokens": sum(len(work.synthetic_sample(t, i)[1]) for i in range(work.N_SAMPLES)),
        }
        for t in range(num_tasks)
    ]
    (run / "prepared" / "plan.json").write_text(json.dumps({"num_tasks": num_tasks, "tasks": tasks}))
    s = dict(executor="local", gpus_per_node=1, time_min=5, max_attempts=1)
    s.update(slurm)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "run_dir": str(run),
                "model": {"path": str(tmp_path)},
                "extract": {"work": work_fn},
                "slurm": s,
                "store": {"chunk_tokens": 8, "shard_tokens": 64},
            }
        )
    )
    return run, cfg


def cli(*argv, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_cli(*argv, env=env, timeout=timeout)


def status(run: Path, env: dict) -> dict:
    r = cli("status", run, "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_for(pred, timeout: float, what: str):
    t0 = time.time()
    while not (v := pred()):
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
    return v


def no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]


# ------------------------------------------------------------------------------------------ liveness
def test_a_killed_child_is_dead_while_it_is_a_zombie_and_a_reused_pid_is_not_it():
    from eagle_batch.launch import proc

    p = subprocess.Popen(["sleep", "60"])
    ticks = proc.start_ticks(p.pid)
    assert ticks > 0 and proc.alive(p.pid, ticks)
    os.kill(p.pid, signal.SIGKILL)
    wait_for(lambda: Path(f"/proc/{p.pid}/stat").read_text().split(")")[1].split()[0] == "Z", 10, "a zombie")
    os.kill(p.pid, 0)  # the old check still finds the zombie ...
    assert not proc.alive(p.pid, ticks)  # ... the new one does not
    p.wait()
    me = os.getpid()
    assert proc.alive(me, proc.start_ticks(me)) and not proc.alive(me, proc.start_ticks(me) + 1)


# ------------------------------------------------------------------------------------------ GPUs
def test_visible_gpus_and_slot_plan():
    from eagle_batch.launch.local import LocalResourceError, plan_slots, visible_gpus

    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,3"}) == ["0", "1", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,-1,3"}) == ["2"]  # CUDA stops at an invalid entry
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-5d2e"}) == ["GPU-5d2e"]
    assert plan_slots(["0", "1", "2", "3"], 2, 64, 5).devices == [["0", "1"], ["2", "3"]]
    assert plan_slots(["0", "1", "2", "3"], 1, 2, 5).devices == [["0"], ["1"]]  # array_parallelism caps slots
    assert plan_slots(["0", "1", "2", "3"], 1, 64, 1).devices == [["0"]]  # no more slots than tasks
    # slurm.tasks_per_gpu_group: K slots per group, spread over the groups first, within the same caps
    assert plan_slots(["0"], 1, 64, 5, per_group=3).devices == [["0"], ["0"], ["0"]]
    assert plan_slots(["0", "1"], 1, 64, 3, per_group=2).devices == [["0"], ["1"], ["0"]]
    assert plan_slots(["0", "1", "2", "3"], 2, 3, 9, per_group=2).devices == [["0", "1"], ["2", "3"], ["0", "1"]]
    assert plan_slots(["0", "1", "2"], 2, 64, 1, per_group=2).devices == [["0", "1"]]
    assert plan_slots([], 1, 64, 3, per_group=3).devices == [[]]  # on the CPU: one at a time, as ever
    cpu = plan_slots([], 8, 64, 3)
    assert cpu.devices == [[]] and "no GPU is visible" in cpu.note
    with pytest.raises(
        LocalResourceError,
        match=r"slurm.gpus_per_node=8 asks for 8 GPUs .* has 1 \(0\); "
        r"set slurm.gpus_per_node=1",
    ):
        plan_slots(["0"], 8, 64, 3)


def test_local_tasks_get_the_gpus_the_config_asks_for(tmp_path):
    run, cfg = make_run(tmp_path, 4, work_fn="tests.slurm.work:env_probe_work", gpus_per_node=2)
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    r = cli("extract", cfg, "--wait", "--interval", "0.5", env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "slot 0: GPUs 0,1; slot 1: GPUs 2,3" in r.stdout
    seen = [json.loads((run / f"seen-{t}.json").read_text()) for t in range(4)]
    lists = [s["CUDA_VISIBLE_DEVICES"].split(",") for s in seen]
    assert all(len(d) == 2 for d in lists), lists
    assert {tuple(d) for d in lists} == {("0", "1"), ("2", "3")}  # both slots ran tasks, disjoint devices
    assert len({s["pid"] for s in seen}) == 4  # one process per task
    t = status(run, env)["totals"]
    assert t["all_done"] and t["progress"] == 1.0


def test_more_gpus_per_task_than_the_machine_has_is_refused_before_anything_starts(tmp_path):
    run, cfg = make_run(tmp_path, 2, work_fn="tests.slurm.work:env_probe_work", gpus_per_node=2)
    r = cli("extract", cfg, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert r.returncode == 2
    assert "slurm.gpus_per_node=2 asks for 2 GPUs per task but this machine has 1 (0)" in r.stderr
    assert "Nothing was submitted" in r.stderr
    no_traceback(r)
    assert not (run / "slurm" / "submissions.jsonl").exists() and not (run / "state").exists()


@pytest.mark.parametrize("share", [False, True])
def test_a_second_run_waits_for_the_gpu_unless_it_shares_devices(tmp_path, share):
    """Two local runs asking for the same GPU: by default the second one's task starts only when the first
    one's has ended (a slot holds its devices); with slurm.share_devices=true both run at once."""
    gpu = f"lock-probe-{os.getpid()}-{int(share)}"  # a device name no other test holds
    env = {"CUDA_VISIBLE_DEVICES": gpu}
    runs = []
    for name, sleep_s in (("a", "1.0"), ("b", "0.05")):  # a: 12 samples, ~12 s; b: under a second
        (tmp_path / name).mkdir()
        run, cfg = make_run(tmp_path / name, 1, share_devices=share)
        (run / "faults" / "sleep_s").write_text(sleep_s)
        runs.append((run, cfg))
    first = cli("extract", runs[0][1], env=env)
    assert first.returncode == 0, first.stderr
    wait_for(lambda: (runs[0][0] / "state" / "task-00000.json").exists(), 60, "the first run's task to start")
    second = cli("extract", runs[1][1], "--wait", "--interval", "0.5", env=env)
    assert second.returncode == 0, second.stderr + second.stdout
    wait_for(lambda: status(runs[0][0], env)["totals"]["all_done"], 60, "the first run to finish")
    (a,), (b,) = (json.loads((run / "state" / "task-00000.json").read_text())["attempts"] for run, _ in runs)
    if share:
        assert b["started"] < a["ended"], (a, b)  # side by side
    else:
        assert b["started"] >= a["ended"], (a, b)  # one after the other


@pytest.mark.parametrize("per_group", [1, 2])
def test_tasks_per_gpu_group_runs_tasks_side_by_side_on_one_gpu(tmp_path, per_group):
    """One GPU, two tasks, slurm.share_devices=true: a group runs its tasks one after another, and with
    slurm.tasks_per_gpu_group=2 both at once, each seeing that GPU."""
    gpu = f"group-probe-{os.getpid()}-{per_group}"
    env = {"CUDA_VISIBLE_DEVICES": gpu}
    run, cfg = make_run(tmp_path, 2, share_devices=True, tasks_per_gpu_group=per_group)
    (run / "faults" / "sleep_s").write_text("0.3")  # ~4 s per task
    r = cli("extract", cfg, "--wait", "--interval", "0.5", env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    (a,), (b,) = (json.loads((run / "state" / f"task-{t:05d}.json").read_text())["attempts"] for t in (0, 1))
    first, second = sorted((a, b), key=lambda x: x["started"])
    if per_group == 2:
        assert second["started"] < first["ended"], (a, b)  # side by side
    else:
        assert second["started"] >= first["ended"], (a, b)  # one after the other
    slots = json.loads(next((run / "slurm").glob("local-*/slots.json")).read_text())
    assert [s["devices"] for s in slots] == [[gpu]] * per_group


def test_tasks_per_gpu_group_without_share_devices_is_refused_before_anything_starts(tmp_path):
    run, cfg = make_run(tmp_path, 2, tasks_per_gpu_group=2)
    r = cli("extract", cfg, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert r.returncode != 0
    assert "slurm.tasks_per_gpu_group=2" in r.stderr and "slurm.share_devices=true" in r.stderr
    no_traceback(r)
    assert not (run / "state").exists()


# ------------------------------------------------------------------------------------------ progress
def test_status_counts_block_appends(tmp_path):
    run, cfg = make_run(tmp_path, 2, work_fn="tests.slurm.work:block_work", gpus_per_node=0)
    env = {}
    r = cli("extract", cfg, "--wait", "--interval", "0.5", env=env)
    assert r.returncode == 0, r.stderr
    st = status(run, env)
    assert st["totals"]["progress"] == 1.0, st["totals"]
    for row in st["tasks"]:
        assert row["state"] == "done"
        assert row["samples_committed"] == row["samples_total"] == work.N_SAMPLES
        assert row["tokens_committed"] == row["tokens_total"] > 0


def test_status_of_a_moved_run_names_the_logs_where_they_are_now(tmp_path):
    # Records keep absolute paths; a run folder moved (from scratch to project space) still shows its logs.
    run, cfg = make_run(tmp_path, 2, work_fn="tests.slurm.work:block_work", gpus_per_node=0)
    r = cli("extract", cfg, "--wait", "--interval", "0.5", env={})
    assert r.returncode == 0, r.stderr
    before = [row["log"] for row in status(run, {})["tasks"]]
    moved = shutil.move(str(run), str(tmp_path / "elsewhere"))
    rows = status(Path(moved), {})["tasks"]
    assert [row["state"] for row in rows] == ["done", "done"]
    for row, old in zip(rows, before):
        assert row["log"] == old.replace(str(run), moved, 1) and Path(row["log"]).is_file()


# ------------------------------------------------------------------------------------------ kills
def _task_pid(run: Path, t: int) -> int:
    st = json.loads((run / "state" / f"task-{t:05d}.json").read_text())
    return int(st["attempts"][-1]["pid"])


def test_killed_local_task_is_failed_resumable_and_wait_follows_the_new_attempt(tmp_path):
    run, cfg = make_run(tmp_path, 2, work_fn="tests.slurm.work:synthetic_work", gpus_per_node=0)
    (run / "faults" / "sleep_s").write_text("0.3")  # ~4 s per task
    env = {}
    full = dict(os.environ, PYTHONPATH=str(REPO), **env)
    # `extract --wait` is the parent of the local job's controller: the case where a dead child was a zombie.
    waiting = subprocess.Popen(
        [sys.executable, "-m", "eagle_batch.cli", "extract", str(cfg), "--wait", "--interval", "0.5"],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
    )
    try:
        wait_for(
            lambda: (
                (run / "state" / "task-00000.json").exists()
                and json.loads((run / "state" / "task-00000.json").read_text())["samples_committed"] >= 2
            ),
            120,
            "task 0 to commit",
        )
        os.kill(_task_pid(run, 0), signal.SIGKILL)
        out, err = waiting.communicate(timeout=120)  # returns once task 1 is done too; never hangs
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 1, err
    rows = {r["task_id"]: r for r in status(run, env)["tasks"]}
    assert rows[0]["state"] == "failed"
    assert "killed by SIGKILL" in rows[0]["last_error"]
    assert rows[1]["state"] == "done"
    committed_before = rows[0]["samples_committed"]
    assert 0 < committed_before < work.N_SAMPLES

    (run / "faults" / "sleep_s").write_text("0.2")
    r = cli("resume", run, "--wait", "--interval", "0.5", env=env)
    assert r.returncode == 0, r.stderr
    assert "resubmitting 1 task(s): 0" in r.stdout
    rows = {r["task_id"]: r for r in status(run, env)["tasks"]}
    assert rows[0]["state"] == "done" and rows[0]["samples_committed"] == work.N_SAMPLES
    assert rows[0]["attempts"] == 2
    from eagle_batch.store import open_dataset

    assert len(open_dataset(run / "stores" / "task-00000.zarr")) == work.N_SAMPLES


def test_the_time_limit_signal_reaches_every_process_of_the_task_and_ends_none(tmp_path):
    """As on Slurm, the checkpoint signal before the limit goes to the task's whole process group; the task's
    helper process (as vLLM's engine core) survives it: the task commits, runs again and finishes."""
    run, cfg = make_run(
        tmp_path, 1, work_fn="tests.slurm.work:engine_process_work", gpus_per_node=0, time_min=1, signal_delay_s=52
    )
    (run / "faults" / "sleep_s").write_text("1")  # 12 samples: past the signal at 8 s
    env = {}
    assert cli("extract", cfg, env=env).returncode == 0
    state = run / "state" / "task-00000.json"
    ended = {"checkpointed", "done", "error"}  # a running attempt's outcome is "running"
    wait_for(lambda: state.exists() and json.loads(state.read_text())["attempts"][0]["outcome"] in ended, 120, "a stop")
    (run / "faults" / "sleep_s").write_text("0.1")
    st = wait_for(lambda: (s := status(run, env))["totals"]["active"] == 0 and s, 120, "the job to end")
    assert st["totals"]["all_done"], st["tasks"]
    s = json.loads(state.read_text())
    # Each attempt gets the signal 8 s in; on a loaded machine a second attempt may not finish its 12 short
    # samples by then and is checkpointed again: any number of checkpoints, then done, and no failure.
    outcomes = [a["outcome"] for a in s["attempts"]]
    assert len(outcomes) >= 2 and outcomes[-1] == "done", s
    assert set(outcomes[:-1]) == {"checkpointed"}, s
    assert s["failures"] == 0


def test_cancel_stops_a_local_job_and_its_tasks_are_resumable(tmp_path):
    run, cfg = make_run(tmp_path, 2, work_fn="tests.slurm.work:synthetic_work", gpus_per_node=0)
    (run / "faults" / "sleep_s").write_text("2")  # 24 s a task: still running when cancel comes on a busy machine
    env = {}
    assert cli("extract", cfg, env=env).returncode == 0
    wait_for(lambda: status(run, env)["tasks"][0]["state"] == "running", 120, "task 0 to run")
    r = cli("cancel", run, env=env)
    assert r.returncode == 0 and "cancelled local job" in r.stdout, r.stdout + r.stderr
    st = wait_for(lambda: (s := status(run, env))["totals"]["active"] == 0 and s, 60, "the job to stop")
    assert {r["state"] for r in st["tasks"]} == {"cancelled"}, st["tasks"]
    r = cli("resume", run, "--dry-run", env=env)
    assert "resubmitting 2 task(s): 0, 1" in r.stdout


def _extract_with_engine_processes(tmp_path: Path, model: Path) -> tuple[Path, dict]:
    """A one-task extraction of 80 demo chats whose vLLM engine core runs in a process of its own, started
    on the local executor; -> (run, env)."""
    run = tmp_path / "run"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "run_dir": str(run),
                "model": {"path": str(model), "max_model_len": 512, "dtype": "float32"},
                "data": {
                    "inputs": [str(REPO / "eagle_batch" / "demo_data" / "chat.jsonl")],
                    "format": "messages",
                    "max_length": 256,
                    "limit": 80,
                },
                "extract": {
                    "num_tasks": 1,
                    "backend": "native",
                    "engine_process": "background",
                    "batch_samples": 1,
                    "commit_interval_s": 0,
                    "enforce_eager": True,
                },
                "store": {"chunk_tokens": 16, "shard_tokens": 64},
                "slurm": {"executor": "local", "gpus_per_node": 0, "max_attempts": 1},
            }
        )
    )
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    assert cli("prepare", cfg, "--no-progress", "--workers", "1", env=env).returncode == 0
    assert cli("extract", cfg, env=env).returncode == 0
    return run, env


def _engine_processes(task_pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-g", str(task_pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if int(p) != task_pid]


@pytest.mark.vllm
@pytest.mark.slow
def test_kill_with_vllm_engine_processes_then_resume_completes(tmp_path, tiny_model):
    """A task killed while vLLM's engine core and worker run in their own processes: they die with it (they
    would hold memory, shared memory and ports, and the resumed attempt's engine would fail to start), and
    `resume` right after the kill reruns the task to completion with the samples committed before kept."""
    run, env = _extract_with_engine_processes(tmp_path, tiny_model("llama"))
    state = run / "state" / "task-00000.json"
    wait_for(lambda: state.exists() and json.loads(state.read_text())["samples_committed"] >= 3, 300, "commits")
    task_pid = _task_pid(run, 0)
    engine = _engine_processes(task_pid)
    assert engine, "the engine should run in processes of its own (extract.engine_process=background)"
    os.kill(task_pid, signal.SIGKILL)
    row = status(run, env)["tasks"][0]
    assert row["state"] == "failed" and 3 <= row["samples_committed"] < 80, row  # at once, not `running`
    r = cli("resume", run, "--wait", "--interval", "1", env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    from eagle_batch.launch import proc

    assert not any(proc.alive(p) for p in engine), "the killed task's engine processes are still running"
    row = status(run, env)["tasks"][0]
    assert row["state"] == "done" and row["samples_committed"] == row["samples_total"] == 80
    r = cli("verify", run, env=env)
    assert r.returncode == 0 and "80 samples verified" in r.stdout, r.stdout + r.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_the_checkpoint_signal_to_every_process_of_a_vllm_task_commits_and_the_task_finishes(tmp_path, tiny_model):
    """Slurm's checkpoint signal reaches every process of the task, vLLM's engine core among them: the engine
    lives on, so the task finishes its batch, commits, stops (`checkpointed`) and its next attempt finishes."""
    run, env = _extract_with_engine_processes(tmp_path, tiny_model("llama"))
    state = run / "state" / "task-00000.json"
    wait_for(lambda: state.exists() and json.loads(state.read_text())["samples_committed"] >= 3, 300, "commits")
    task_pid = _task_pid(run, 0)
    assert _engine_processes(task_pid), "the engine should run in processes of its own"
    os.killpg(task_pid, signal.SIGUSR2)  # as slurmstepd signals a step
    st = wait_for(lambda: (s := status(run, env))["totals"]["active"] == 0 and s, 600, "the job to end")
    s = json.loads(state.read_text())
    assert [a["outcome"] for a in s["attempts"]] == ["checkpointed", "done"], json.dumps(s["attempts"], indent=1)
    assert s["failures"] == 0 and st["tasks"][0]["samples_committed"] == 80

"""Extraction arrays on a REAL Slurm (start one with `.ci/slurm-up.sh`; skipped when sbatch is missing).

- the real pipeline (prepare -> extract, hf backend, tiny Llama) completes as a 4-task array and
  `status --json` is right before, during and after;
- a task cancelled mid-way, then `resume`: identical data to an uninterrupted run, committed samples
  not recomputed; a duplicate submission (CLI, and a raw duplicate job) is refused, data untouched;
- a task reaching its time limit checkpoints, is requeued and completes;
- a task that raises on every attempt gives up after slurm.max_attempts, is reported with its error and
  log path, and is the only task `resume` resubmits.

Apart from the first, the tests use `tests/slurm/work.py:synthetic_work` (as `extract.work`): the
real ArrayTask, state files, Slurm and store writer, with deterministic states instead of a model, so
faults can be timed and the suite stays within a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.slurm import work  # noqa: E402

pytestmark = pytest.mark.slurm

ACTIVE = {"pending", "requeued", "running"}


# ------------------------------------------------------------------------------------------ helpers
def cli(capsys, *argv: str) -> tuple[int, str, str]:
    from eagle_batch.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def status(capsys, run: Path) -> dict:
    rc, out, err = cli(capsys, "status", run, "--json")
    assert rc == 0, err
    return json.loads(out)


def wait_for(pred, timeout: float, what: str, interval: float = 1.0):
    t0 = time.time()
    while True:
        v = pred()
        if v:
            return v
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def wait_idle(capsys, run: Path, timeout: float) -> dict:
    box = {}

    def idle():
        box["s"] = status(capsys, run)
        return box["s"]["totals"]["active"] == 0

    wait_for(idle, timeout, f"no active task in {run}")
    return box["s"]


@pytest.fixture
def synthetic(monkeypatch):
    # Jobs inherit the environment at sbatch time: they must import tests.slurm.work too.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def make_synthetic_run(
    tmp_path: Path, name: str, num_tasks: int, work_fn: str = "tests.slurm.work:synthetic_work", **slurm
) -> tuple[Path, Path]:
    """A run directory with a plan for synthetic tasks (`work_fn` runs them), and its config file."""
    run = tmp_path / name
    (run / "prepared").mkdir(parents=True)
    (run / "faults").mkdir()
    tasks = [
        {
            "task_id": t,
            "rows": list(range(work.N_SAMPLES)),
            "num_tokens": sum(len(work.synthetic_sample(t, i)[1]) for i in range(work.N_SAMPLES)),
        }
        for t in range(num_tasks)
    ]
    (run / "prepared" / "plan.json").write_text(json.dumps({"num_tasks": num_tasks, "tasks": tasks}))
    s = dict(executor="slurm", gpus_per_node=1, cpus_per_task=1, time_min=5, max_attempts=2)
    s.update(slurm)
    cfg = tmp_path / f"{name}.yaml"
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


def reference_run(tmp_path: Path, num_tasks: int) -> Path:
    """The same tasks run uninterrupted, in-process (no Slurm): what every Slurm run must equal."""
    from eagle_batch.launch import ArrayTask

    run, cfg = make_synthetic_run(tmp_path, "reference", num_tasks)
    from eagle_batch.config import load_config, save_config

    save_config(load_config(cfg), run)
    for t in range(num_tasks):
        ArrayTask(run, t)()
    return run


def assert_same_data(run: Path, ref: Path, num_tasks: int) -> None:
    from eagle_batch.store import open_dataset

    for t in range(num_tasks):
        a = open_dataset(run / "stores" / f"task-{t:05d}.zarr")
        b = open_dataset(ref / "stores" / f"task-{t:05d}.zarr")
        assert len(a) == len(b) == work.N_SAMPLES
        for i in range(len(b)):
            x, y = a[i], b[i]
            assert x["sample_id"] == y["sample_id"]
            assert np.array_equal(np.asarray(x["input_ids"]), np.asarray(y["input_ids"]))
            assert np.array_equal(np.asarray(x["loss_mask"]), np.asarray(y["loss_mask"]))
            assert (
                x["hidden_states"]
                .view(dtype=__import__("torch").int16)
                .equal(y["hidden_states"].view(dtype=__import__("torch").int16))
            ), f"task {t} sample {i} differs"


# -------------------------------------------------------------------------- real pipeline completes
@pytest.mark.slow
def test_real_pipeline_array_completes_and_status_each_stage(tmp_path, capsys, tiny_model, monkeypatch):
    model = tiny_model("llama")
    run = tmp_path / "real"
    cfg = tmp_path / "real.yaml"
    cfg.write_text(
        json.dumps(
            {
                "run_dir": str(run),
                "model": {"path": str(model), "max_model_len": 512},
                "data": {
                    "inputs": [str(REPO / "configs" / "data" / "demo-chat.jsonl")],
                    "format": "messages",
                    "max_length": 256,
                    "limit": 12,
                },
                "extract": {"num_tasks": 4, "backend": "hf", "batch_samples": 2, "commit_interval_s": 0},
                "store": {"chunk_tokens": 16, "shard_tokens": 256},
                "slurm": {
                    "executor": "slurm",
                    "gpus_per_node": 1,
                    "cpus_per_task": 1,
                    "time_min": 10,
                    "max_attempts": 1,
                },
            }
        )
    )
    rc, out, err = cli(capsys, "prepare", cfg, "--workers", "1", "--no-progress")
    assert rc == 0, err
    plan = json.loads((run / "prepared" / "plan.json").read_text())
    assert plan["num_tasks"] == 4

    # Stage 0: prepared, nothing submitted.
    st = status(capsys, run)
    assert [r["state"] for r in st["tasks"]] == ["not_submitted"] * 4
    assert st["totals"]["tokens_total"] == sum(t["num_tokens"] for t in plan["tasks"]) > 0

    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 0, err
    array = json.loads((run / "slurm" / "submissions.jsonl").read_text().splitlines()[-1])["job_id"]

    # Stage 1: queued or running, each task on its own array index.
    st = status(capsys, run)
    assert [r["job_id"] for r in st["tasks"]] == [f"{array}_{i}" for i in range(4)]
    assert {r["state"] for r in st["tasks"]} <= ACTIVE | {"done"}
    assert st["totals"]["tasks"] == 4 and st["totals"]["active"] + st["totals"]["done"] == 4

    # Stage 2: the end. Every sample of the plan is in the task stores.
    st = wait_idle(capsys, run, timeout=240)
    assert st["totals"]["all_done"], json.dumps(st, indent=1)
    for r, t in zip(st["tasks"], plan["tasks"]):
        assert r["state"] == "done" and r["slurm_state"] == "COMPLETED"
        assert r["samples_committed"] == r["samples_total"] == len(t["rows"])
        assert r["tokens_committed"] == r["tokens_total"] == t["num_tokens"]
        assert r["progress"] == 1.0 and r["attempts"] == 1 and r["last_error"] == ""
        assert Path(r["log"]).is_file()
    assert st["totals"]["tokens_committed"] == st["totals"]["tokens_total"]

    from eagle_batch.data import PreparedDataset
    from eagle_batch.store import open_dataset

    prepared = PreparedDataset(run)
    for t in range(4):
        ds = open_dataset(run / "stores" / f"task-{t:05d}.zarr")
        samples = prepared.task_samples(t)
        assert len(ds) == len(samples)
        got = {ds[i]["sample_id"]: ds[i] for i in range(len(ds))}
        for s in samples:
            g = got[s.sample_id]
            assert np.array_equal(np.asarray(g["input_ids"]), s.input_ids)
            assert g["hidden_states"].shape[0] == len(s.input_ids)
            assert bool(g["hidden_states"].float().isfinite().all())


# ------------------------------------------------------------------------- GPUs Slurm assigned
def test_extraction_tasks_see_the_gpus_slurm_assigned(tmp_path, capsys, monkeypatch, synthetic):
    """slurm.gpus_per_node reaches sbatch, and the task process sees exactly the GPUs Slurm gave its job."""
    run, cfg = make_synthetic_run(tmp_path, "gpus", 2, work_fn="tests.slurm.work:env_probe_work", gpus_per_node=4)
    rc, out, err = cli(capsys, "extract", cfg, "--wait", "--interval", "1")
    assert rc == 0, err + out
    for t in range(2):
        seen = json.loads((run / f"seen-{t}.json").read_text())
        devices = seen["CUDA_VISIBLE_DEVICES"].split(",")
        assert len(devices) == 4 and len(set(devices)) == 4, seen
        assert set(devices) <= {str(i) for i in range(8)}  # the node's 8 (fake) GPUs
        assert seen["SLURM_JOB_GPUS"] == seen["CUDA_VISIBLE_DEVICES"], seen
    assert status(capsys, run)["totals"]["all_done"]


# ------------------------------------------------------------- cancel mid-way, duplicate, resume
def test_cancel_midway_duplicate_refused_resume_identical(tmp_path, capsys, synthetic):
    from eagle_batch.config import load_run_config
    from eagle_batch.launch import ArrayTask, make_executor

    n = 4
    ref = reference_run(tmp_path, n)
    run, cfg = make_synthetic_run(tmp_path, "cancel", n)
    (run / "faults" / "sleep_s").write_text("1.0")
    # Task 0 stays busy until the raw duplicate below has met its lock (the node is shared: it may
    # take a while to start); it is sped up afterwards.
    (run / "faults" / "sleep_s-0").write_text("3")
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 0, err

    def midway():
        st = status(capsys, run)
        r = st["tasks"][1]
        return st if r["state"] == "running" and 3 <= r["samples_committed"] < work.N_SAMPLES - 3 else None

    st = wait_for(midway, 60, "task 1 half-way")

    # A duplicate submission through the CLI is refused, and nothing is submitted.
    subs_before = (run / "slurm" / "submissions.jsonl").read_text()
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 2 and "already has" in err and "Nothing was submitted" in err and "eagle-batch cancel" in err
    assert (run / "slurm" / "submissions.jsonl").read_text() == subs_before

    # A raw duplicate job of task 0 (bypassing the CLI check) is refused by the store lock.
    ex = make_executor(load_run_config(run), run, kind="dup", executor="slurm")
    dup = ex.submit(ArrayTask(str(run), 0))

    rc, out, err = cli(capsys, "cancel", run, "--task", "1")
    assert rc == 0 and "cancelled" in out, err
    st = wait_for(lambda: (s := status(capsys, run))["tasks"][1]["state"] == "cancelled" and s, 60, "task 1 cancelled")
    cancelled_at = st["tasks"][1]["tokens_committed"]
    assert 0 < cancelled_at < st["tasks"][1]["tokens_total"]
    assert st["tasks"][1]["last_error"].startswith("Slurm state CANCELLED")

    with pytest.raises(Exception) as e:
        dup.result()
    assert "already being written by another job" in str(e.value) and "wrote nothing" in str(e.value)

    (run / "faults" / "sleep_s").write_text("0")
    (run / "faults" / "sleep_s-0").write_text("0")
    st = wait_idle(capsys, run, 90)
    assert [r["state"] for r in st["tasks"]] == ["done", "cancelled", "done", "done"]
    assert st["tasks"][0]["attempts"] == 1  # the duplicate never wrote task 0's state

    rc, out, err = cli(capsys, "resume", run)
    assert rc == 0 and "resubmitting 1 task(s): 1" in out, err
    last = json.loads((run / "slurm" / "submissions.jsonl").read_text().splitlines()[-1])
    assert last["kind"] == "resume" and last["tasks"] == [1]
    st = wait_idle(capsys, run, 90)
    assert st["totals"]["all_done"], json.dumps(st, indent=1)

    t1 = json.loads((run / "state" / "task-00001.json").read_text())
    assert [a["outcome"] for a in t1["attempts"]] == ["killed", "done"]
    # The resumed attempt computed only what the cancelled one had not committed.
    assert t1["attempt_tokens"] == t1["tokens_total"] - cancelled_at
    assert_same_data(run, ref, n)


# ------------------------------------------------------------------------- time limit -> requeue
def test_time_limit_checkpoints_requeues_and_completes(tmp_path, capsys, synthetic):
    ref = reference_run(tmp_path, 1)
    # 1 minute limit, checkpoint signal 10 s before it. slurmctld checks time limits every 30 s and sends
    # the signal at the first check that finds at most signal delay + 30 s left: here at 20-50 s of run
    # time, never during the interpreter's start (a SIGUSR2 before submitit installs its handler kills the
    # process). 12 samples x 5 s cannot finish before the signal; the task stops within one sample (5 s)
    # of it, before the limit's kill (at the first check after 60 s).
    run, cfg = make_synthetic_run(tmp_path, "timeout", 1, time_min=1, signal_delay_s=10, max_num_timeout=10)
    (run / "faults" / "sleep_s").write_text("5")
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 0, err
    wait_for(lambda: status(capsys, run)["tasks"][0]["state"] == "requeued", 120, "the checkpoint requeue")
    (run / "faults" / "sleep_s").write_text("0.5")  # later attempts finish quickly
    st = wait_idle(capsys, run, 150)
    assert st["totals"]["all_done"], json.dumps(st, indent=1)
    s = json.loads((run / "state" / "task-00000.json").read_text())
    outcomes = [a["outcome"] for a in s["attempts"]]
    assert outcomes[0] == "checkpointed" and outcomes[-1] == "done" and len(outcomes) >= 2
    # Requeues of one job: consecutive restart counts. The first need not be 0: a run requeued before the
    # task wrote its first state (a late-starting interpreter on a loaded machine) leaves no attempt.
    restarts = [a["restart"] for a in s["attempts"]]
    assert restarts == list(range(restarts[0], restarts[0] + len(outcomes)))
    assert s["failures"] == 0
    assert_same_data(run, ref, 1)


# ------------------------------------------------ the checkpoint signal reaches every process of the step
def test_the_checkpoint_signal_ends_none_of_the_processes_a_task_started(tmp_path, capsys, synthetic):
    """slurmstepd signals every process of the step; the task's helper process (as vLLM's engine core) must
    survive it, so the task commits, is requeued and finishes without a failed attempt."""
    run, cfg = make_synthetic_run(tmp_path, "engine", 1, work_fn="tests.slurm.work:engine_process_work")
    (run / "faults" / "sleep_s").write_text("1")
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 0, err
    array = json.loads((run / "slurm" / "submissions.jsonl").read_text().splitlines()[-1])["job_id"]
    wait_for(lambda: status(capsys, run)["tasks"][0]["samples_committed"] >= 2, 120, "the first commits")
    subprocess.run(["scancel", "--signal=USR2", array], check=True)
    wait_for(lambda: status(capsys, run)["tasks"][0]["state"] == "requeued", 120, "the checkpoint requeue")
    (run / "faults" / "sleep_s").write_text("0.1")
    st = wait_idle(capsys, run, 150)
    assert st["totals"]["all_done"], json.dumps(st, indent=1)
    s = json.loads((run / "state" / "task-00000.json").read_text())
    assert [a["outcome"] for a in s["attempts"]] == ["checkpointed", "done"], json.dumps(s, indent=1)
    assert s["failures"] == 0


# ----------------------------------------------------------- raising task: gives up, then resume
def test_failing_task_gives_up_is_reported_and_only_it_is_resumed(tmp_path, capsys, synthetic):
    run, cfg = make_synthetic_run(tmp_path, "raise", 4, max_attempts=2)
    (run / "faults" / "raise-2").write_text("")
    # --wait follows the array to its end (progress lines on a non-tty) and fails: one task gave up.
    rc, out, err = cli(capsys, "extract", cfg, "--wait", "--interval", "1")
    assert rc == 1, out + err
    assert "submitted Slurm array" in out and "3/4 tasks done" in out.splitlines()[-1] and "gave_up=1" in out
    st = status(capsys, run)
    states = [r["state"] for r in st["tasks"]]
    assert states == ["done", "done", "gave_up", "done"], json.dumps(st, indent=1)
    bad = st["tasks"][2]
    assert bad["attempts"] == 2 and bad["failures"] == 2 and bad["slurm_state"] == "FAILED"
    assert "injected failure in task 2" in bad["last_error"]
    assert Path(bad["log"]).is_file() and "injected failure in task 2" in Path(bad["log"]).read_text()
    rc, out, err = cli(capsys, "status", run)  # the table shows the error line too
    assert "gave_up" in out and "error: RuntimeError: injected failure in task 2" in out

    (run / "faults" / "raise-2").unlink()
    rc, out, err = cli(capsys, "resume", run)
    assert rc == 0 and "resubmitting 1 task(s): 2" in out, err
    last = json.loads((run / "slurm" / "submissions.jsonl").read_text().splitlines()[-1])
    assert last["tasks"] == [2]
    st = wait_idle(capsys, run, 90)
    assert st["totals"]["all_done"], json.dumps(st, indent=1)
    assert st["tasks"][2]["attempts"] == 3 and st["tasks"][0]["attempts"] == 1


# ------------------------------------------------------------------------------- chaining (afterok)
def test_submit_after_waits_for_extraction_and_aggregates(tmp_path, capsys, synthetic):
    import subprocess

    from eagle_batch.launch import submit_after

    run, cfg = make_synthetic_run(tmp_path, "chain", 2)
    (run / "faults" / "sleep_s").write_text("0.5")
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 0, err
    array = json.loads((run / "slurm" / "submissions.jsonl").read_text().splitlines()[-1])["job_id"]
    probe = tmp_path / "probe.json"
    sub = submit_after(run, work.chained_probe, str(run), str(probe), name="train")
    assert sub.dependency == f"afterok:{array}"
    reason = subprocess.run(["squeue", "-h", "-j", sub.job_id, "-o", "%r"], capture_output=True, text=True).stdout
    assert "Dependency" in reason, reason  # held while the array runs
    wait_for(probe.exists, 120, "the chained job to run")
    seen = json.loads(probe.read_text())
    assert seen["states"] == ["done", "done"] and seen["dataset_json"] is True
    ends = [json.loads((run / "state" / f"task-{t:05d}.json").read_text())["attempts"][-1]["ended"] for t in range(2)]
    assert seen["time"] > max(ends)


# ------------------------------------------------------------------ resources and container wrapping
def test_a_request_no_node_can_meet_is_refused_before_submission(tmp_path, capsys, synthetic):
    # sbatch accepts such a job and it stays PENDING (PartitionConfig) for ever; `--wait` would watch it.
    run, cfg = make_synthetic_run(tmp_path, "toobig", 1, cpus_per_task=999)
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc != 0 and "slurm.cpus_per_task=999 (the most any node has: " in err and "Nothing was submitted." in err
    assert "Traceback" not in err and not (run / "slurm").exists()
    rc, out, err = cli(capsys, "extract", cfg, "slurm.partition=nosuch", "slurm.cpus_per_task=1")
    assert rc != 0 and "slurm.partition=nosuch: the cluster has no such partition" in err


def test_a_job_slurm_will_never_start_is_named_and_not_waited_for(tmp_path, capsys, synthetic, monkeypatch):
    # A request no node can meet, submitted where the fit check cannot see the nodes (sinfo not answering):
    # sbatch accepts it and Slurm keeps it PENDING (PartitionConfig) for ever.
    from eagle_batch.launch import slurm_fit

    monkeypatch.setattr(slurm_fit, "read_partitions", lambda timeout_s=30.0: None)
    run, cfg = make_synthetic_run(tmp_path, "never", 1, cpus_per_task=999)
    try:
        rc, out, err = cli(capsys, "extract", cfg, "--wait", "--interval", "0.5")
        assert rc == 1 and "stopped following: task 0: Slurm will not start it: pending for PartitionConfig" in out, (
            out,
            err,
        )
        (row,) = status(capsys, run)["tasks"]
        assert row["state"] == "pending" and row["pending_reason"] == "PartitionConfig"
        assert f"`eagle-batch cancel {run}`, correct the setting, then `eagle-batch resume {run}`" in row["last_error"]
    finally:
        cli(capsys, "cancel", run)


def test_sbatch_resources_and_container_wrapping(tmp_path):
    from eagle_batch.config import load_config
    from eagle_batch.launch import make_executor

    def script(*overrides):
        cfg = load_config(None, ["run_dir=" + str(tmp_path / "r"), "model.path=/models/m", *overrides])
        ex = make_executor(cfg, cfg.run_dir, executor="slurm", check_fits=False)  # partition gpu is not here
        return ex._make_submission_file_text(ex._submitit_command_str, "x")

    s = script(
        "slurm.partition=gpu",
        "slurm.account=proj",
        "slurm.qos=high",
        "slurm.constraint=h200",
        "slurm.exclusive=true",
        "slurm.mem_gb=64",
        "slurm.time_min=90",
        "slurm.cpus_per_task=16",
        "slurm.additional_sbatch=['--mail-type=END', '#SBATCH --reservation res1']",
        "slurm.setup=['module load cuda']",
    )
    for line in (
        "--gpus-per-node=8",
        "--partition=gpu",
        "--account=proj",
        "--qos=high",
        "--constraint=h200",
        "--exclusive",
        "--mem=64GB",
        "--time=90",
        "--cpus-per-task=16",
        "--mail-type=END",
        "--reservation=res1",
        "--signal=USR2@120",
    ):
        assert f"#SBATCH {line}" in s, (line, s)
    assert "module load cuda" in s

    def command(s):
        return next(ln for ln in s.splitlines() if "eagle_batch.launch.submitit_entry" in ln)

    s = script(
        "slurm.container.runtime=apptainer",
        "slurm.container.image=/img/eb.sif",
        "slurm.container.binds=['/scratch:/scratch']",
    )
    cmd = command(s)
    # No scontrol in the image: the host-side teardown does the requeues (see test_host_side_requeue...).
    assert "export EAGLE_BATCH_HOST_REQUEUE=" in s and 'scontrol requeue "$SLURM_JOB_ID"' in s
    assert "apptainer exec --nv" in cmd and "/img/eb.sif python3 -u -m eagle_batch.launch.submitit_entry" in cmd
    assert f"--bind {tmp_path / 'r'}:{tmp_path / 'r'}" in cmd and "--bind /models/m:/models/m" in cmd
    assert "--bind /scratch:/scratch" in cmd

    s = script("slurm.container.runtime=pyxis", "slurm.container.image=nvcr.io#eb:1")
    cmd = command(s)
    assert cmd.startswith("srun ") and "--container-image=nvcr.io#eb:1" in cmd
    assert "--container-mounts=" in cmd and " python3 -u -m eagle_batch.launch.submitit_entry" in cmd

    from eagle_batch.launch.submit import SubmitError

    with pytest.raises(SubmitError, match="slurm.container.image"):
        script("slurm.container.runtime=apptainer")


# ------------------------------------------------------------------------ requeue of a whole array
def test_whole_array_requeue_resumes_from_commits(tmp_path, capsys, synthetic):
    """`scontrol requeue ARRAY` (no checkpoint signal: the tasks are killed) restarts every task from
    its last commit; the data equals an uninterrupted run and nothing committed is recomputed."""
    import subprocess

    n = 2
    ref = reference_run(tmp_path, n)
    run, cfg = make_synthetic_run(tmp_path, "requeue", n)
    # Slow enough that Slurm's KillWait (5 s between SIGTERM and SIGKILL) cannot let a task finish.
    (run / "faults" / "sleep_s").write_text("1.5")
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 0, err
    array = json.loads((run / "slurm" / "submissions.jsonl").read_text().splitlines()[-1])["job_id"]

    def all_running():
        s = status(capsys, run)
        return all(r["state"] == "running" and r["samples_committed"] >= 2 for r in s["tasks"])

    wait_for(all_running, 60, "all tasks running with commits")
    r = subprocess.run(["scontrol", "requeue", array], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wait_for(
        lambda: any(r["state"] == "requeued" or r["attempts"] >= 2 for r in status(capsys, run)["tasks"]),
        30,
        "the requeue to show",
    )
    (run / "faults" / "sleep_s").write_text("0")
    st = wait_idle(capsys, run, 120)
    assert st["totals"]["all_done"], json.dumps(st, indent=1)
    for t in range(n):
        s = json.loads((run / "state" / f"task-{t:05d}.json").read_text())
        assert [a["outcome"] for a in s["attempts"]][-2:] == ["killed", "done"], s["attempts"]
        assert 0 < s["attempt_tokens"] < s["tokens_total"]  # the last attempt did only the rest
    assert_same_data(run, ref, n)


# ------------------------------------------------------------------------------- resume --repair
def test_resume_repair_recomputes_only_the_damaged_part(tmp_path, capsys, synthetic):
    n = 2
    ref = reference_run(tmp_path, n)
    run, cfg = make_synthetic_run(tmp_path, "repair", n)
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 0, err
    assert wait_idle(capsys, run, 90)["totals"]["all_done"]
    shards = sorted((run / "stores" / "task-00001.zarr" / "hidden_states" / "c").rglob("*"))
    shards = [p for p in shards if p.is_file()]
    assert len(shards) >= 3, shards  # 64-token shards: the damage hits the middle of the task
    victim = shards[len(shards) // 2]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))

    rc, out, err = cli(capsys, "resume", run, "--repair")
    assert rc == 0, err
    assert "task 1:" in out and "task 0:" not in out and "resubmitting 1 task(s): 1" in out, out
    last = json.loads((run / "slurm" / "submissions.jsonl").read_text().splitlines()[-1])
    assert last["tasks"] == [1]
    st = wait_idle(capsys, run, 90)
    assert st["totals"]["all_done"], json.dumps(st, indent=1)
    s1 = json.loads((run / "state" / "task-00001.json").read_text())
    assert 0 < s1["attempt_tokens"] < s1["tokens_total"]  # recomputed from the damaged shard on, not all
    assert not (run / "state" / "repair-00001.json").exists()
    from eagle_batch.store import verify

    assert verify(run / "stores" / "task-00001.zarr") == []
    assert_same_data(run, ref, n)


# ------------------------------------------------- requeue from the batch script (container runs)
def test_host_side_requeue_when_the_task_cannot_run_scontrol(tmp_path, capsys, synthetic, monkeypatch):
    """In a container the task usually has no `scontrol`: it leaves a request file and the batch script's
    teardown (on the host) requeues it. Forced here without a container: the failed first attempt must be
    requeued that way and the second attempt must run."""
    monkeypatch.setenv("EAGLE_BATCH_HOST_REQUEUE", "1")
    run, cfg = make_synthetic_run(tmp_path, "hostrq", 1, max_attempts=2)
    (run / "faults" / "raise-0").write_text("")
    rc, out, err = cli(capsys, "extract", cfg)
    assert rc == 0, err
    script = next((run / "slurm").rglob("*_submission.sh")).read_text()
    assert "export EAGLE_BATCH_HOST_REQUEUE=" in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    st = wait_idle(capsys, run, 120)
    r = st["tasks"][0]
    assert r["state"] == "gave_up" and r["attempts"] == 2 and r["failures"] == 2, json.dumps(st, indent=1)
    assert "requested from the batch script" in Path(r["log"]).read_text()
    assert not any((run / "slurm" / "requeue").iterdir())  # the teardown consumed the request

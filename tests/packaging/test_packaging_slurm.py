"""slurm/render.py and the hand-submission templates.

Without Slurm: the rendered scripts lint clean and wrap the container exactly as the submitit launcher
does. With the local Slurm (.ci/slurm-up.sh): the templates, rendered with the container switched off,
prepare the demo chats and extract them to completion (vLLM on the CPU, a 6-layer random-weight Llama
with the real SmolLM2 tokenizer: the templates are under test here, not the model), and eagle-batch's
own status and readers see the result.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle_batch.config import load_config

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "slurm" / "render.py"


def render(tmp_path: Path, *args: str) -> Path:
    r = subprocess.run([sys.executable, str(RENDER), *args], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.splitlines()[0]).parent


def sbatch_lines(script: Path) -> list[str]:
    return [ln[len("#SBATCH ") :] for ln in script.read_text().splitlines() if ln.startswith("#SBATCH ")]


@pytest.mark.parametrize("runtime", ["none", "apptainer", "pyxis"])
def test_rendered_scripts_lint_and_wrap_like_the_launcher(tmp_path, runtime, tool):
    from eagle_batch.launch.submit import container_wrapping

    run = tmp_path / "run"
    extra = tmp_path / "site.yaml"
    extra.write_text(
        "slurm:\n  partition: gpu-b200\n  additional_sbatch: ['--mail-type=END', '#SBATCH --reservation=r1']\n"
        "  setup: ['export EAGLE_BATCH_CACHE=/shared/cache']\n"
        f"  container:\n    runtime: {runtime}\n    image: /img/eb.sif\n    binds: ['/shared/cache:/shared/cache']\n"
    )
    out = render(tmp_path, "configs/models/kimi-k2.5.yaml", str(extra), f"run_dir={run}")
    assert out == run / "slurm" / "manual"
    names = {p.name for p in out.iterdir()}
    assert {
        "env.sh",
        "lib.sh",
        "cache-env.sh",
        "config.yaml",
        "prepare.sbatch",
        "extract.sbatch",
        "train.sbatch",
        "submit.sh",
    } <= names
    assert (run / "config.yaml").is_file()  # the run's own config, as `eagle-batch extract` writes it

    # The same wrapper as submitit's path: compare with the launcher's own function.
    cfg = load_config([out / "config.yaml"])
    python, srun_args = container_wrapping(cfg, Path(cfg.run_dir))
    probe = subprocess.run(
        [
            "bash",
            "-c",
            f'. {shlex.quote(str(out / "env.sh"))}; printf "%s\\n" "${{EB_PYTHON[@]}}"; echo ---; '
            'printf "%s\\n" "${EB_SRUN_ARGS[@]}"; echo ---; echo "$EB_CONTAINER_RUNTIME"',
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    py, srun, rt = probe.stdout.split("---\n")
    assert py.split() == (shlex.split(python) if python else ["python3"])
    assert srun.split() == srun_args
    assert rt.strip() == runtime
    if runtime == "apptainer":
        assert py.split()[:3] == ["apptainer", "exec", "--nv"] and "/img/eb.sif" in py.split()
        assert "/shared/cache:/shared/cache" in py.split()
        assert (
            f"{run}:{run}" in py.split() and "/models/moonshotai/Kimi-K2.5:/models/moonshotai/Kimi-K2.5" in py.split()
        )
    if runtime == "pyxis":
        assert "--container-image=/img/eb.sif" in srun.split()

    ext = sbatch_lines(out / "extract.sbatch")
    assert "--gpus-per-node=8" in ext and "--exclusive" in ext and "--partition=gpu-b200" in ext
    assert "--signal=B:USR2@300" in ext and "--requeue" in ext
    assert "--mail-type=END" in ext and "--reservation=r1" in ext
    assert f"--output={run}/slurm/%A_%a/%A_%a_0_log.out" in ext
    assert not any(o.startswith("--gpus") for o in sbatch_lines(out / "prepare.sbatch"))

    files = [
        out / n
        for n in ("env.sh", "lib.sh", "cache-env.sh", "prepare.sbatch", "extract.sbatch", "train.sbatch", "submit.sh")
    ]
    r = subprocess.run(
        [tool("shellcheck"), "--shell=bash", "--external-sources", *map(str, files)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout


def test_render_refuses_a_run_dir_of_another_run(tmp_path):
    run = tmp_path / "run"
    render(tmp_path, "configs/demo.yaml", f"run_dir={run}")
    r = subprocess.run(
        [sys.executable, str(RENDER), "configs/demo.yaml", f"run_dir={run}", "data.max_length=64"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 2 and "already holds another run" in r.stderr


def _wait_gone(job: str, timeout_s: float) -> None:
    end = time.time() + timeout_s
    while time.time() < end:
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i %T"], capture_output=True, text=True)
        if q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(5)
    subprocess.run(["scancel", job])
    pytest.fail(f"job {job} still queued or running after {timeout_s:.0f} s")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_templates_run_a_small_extraction_on_local_slurm(tmp_path, tiny_model):
    from eagle_batch.launch.state import read_state, read_submissions
    from eagle_batch.launch.status import run_status
    from eagle_batch.models.smollm2 import cache_root
    from eagle_batch.store import open_dataset, verify

    run = tmp_path / "run"
    site = tmp_path / "local.yaml"
    # The container switched off; the job's Python is this venv, as slurm.setup says on a real site.
    site.write_text(
        json.dumps(
            {
                "model": {"path": str(tiny_model("llama"))},
                "slurm": {
                    "executor": "slurm",
                    "time_min": 20,
                    "cpus_per_task": 1,
                    "gpus_per_node": 0,
                    "array_parallelism": 2,
                    "container": {"runtime": "none"},
                    "setup": [
                        f". {shlex.quote(str(Path(sys.prefix) / 'bin' / 'activate'))}",
                        "export VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 "
                        "TOKENIZERS_PARALLELISM=false",
                        f"export EAGLE_BATCH_CACHE={shlex.quote(str(cache_root()))}",
                    ],
                },
            }
        )
    )
    # The 20-chat fixture in 2 tasks (the demo itself runs 300 chats in 4).
    out = render(
        tmp_path,
        "configs/demo.yaml",
        str(site),
        f"run_dir={run}",
        f"data.inputs=[{REPO / 'configs' / 'data' / 'demo-chat.jsonl'}]",
        "extract.num_tasks=2",
    )
    r = subprocess.run(["bash", str(out / "submit.sh"), "--no-train"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr + "".join(p.read_text() for p in out.glob("prepare-*.out"))
    array = r.stdout.strip().splitlines()[-1]
    assert array.isdigit(), r.stdout
    _wait_gone(array, 1200)

    plan = json.loads((run / "prepared" / "plan.json").read_text())
    n = plan["num_tasks"]
    assert n == 2
    logs = "\n".join(p.read_text()[-3000:] for p in (run / "slurm").glob(f"{array}_*/*_log.*"))
    for t in range(n):
        st = read_state(run, t)
        assert st is not None and st.status == "done", logs
        assert st.samples_committed == st.samples_total == plan["tasks"][t]["num_samples"]
        store = run / "stores" / f"task-{t:05d}.zarr"
        assert verify(store) == []
        ds = open_dataset(store)
        assert len(ds) == plan["tasks"][t]["num_samples"]
        s = ds[0]
        # 6 layers: the default rule [2, 3, 3, 6] without the repeat; hidden 256.
        assert tuple(s["hidden_states"].shape) == (len(s["input_ids"]), 3, 256)
        # The logs went where submitit puts them, so `eagle-batch status` can point at them.
        assert (run / "slurm" / f"{array}_{t}" / f"{array}_{t}_0_log.err").is_file()

    (sub,) = read_submissions(run)
    assert (sub.job_id, sub.executor, sub.tasks, sub.kind) == (array, "slurm", list(range(n)), "extract")
    status = run_status(run)
    assert status["totals"]["done"] == n, status


# A work of the test's own (extract.work, see eagle_batch/launch/work.py): task 0 waits for the checkpoint
# signal on its first attempt; task 1 raises on its first attempt. Both finish on their second attempt.
REQUEUE_WORK = """
import time
from pathlib import Path


def work(ctx):
    marker = Path(ctx.run_dir) / f"attempts-{ctx.task_id}"
    with open(marker, "a") as f:
        f.write("x")
    attempt = len(marker.read_text())
    ctx.set_totals(1, 1)
    ctx.report(0, 0)
    if attempt > 1:
        ctx.report(1, 1)
        return True
    if ctx.task_id == 1:
        raise RuntimeError("planned failure of the first attempt")
    end = time.time() + 300
    while not ctx.should_stop() and time.time() < end:
        time.sleep(0.5)
    return False
"""


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_extract_template_requeues_on_checkpoint_signal_and_on_failure(tmp_path):
    from eagle_batch.launch.state import read_state

    run = tmp_path / "run"
    (tmp_path / "eb_requeue_work.py").write_text(REQUEUE_WORK)
    site = tmp_path / "local.yaml"
    site.write_text(
        json.dumps(
            {
                "model": {"path": "/nonexistent"},  # the test work loads no model
                "extract": {"work": "eb_requeue_work:work"},
                "slurm": {
                    "executor": "slurm",
                    "time_min": 2,
                    "signal_delay_s": 60,
                    "cpus_per_task": 1,
                    "gpus_per_node": 0,
                    "max_attempts": 3,
                    "max_num_timeout": 2,
                    "array_parallelism": 2,
                    "container": {"runtime": "none"},
                    "setup": [
                        f". {shlex.quote(str(Path(sys.prefix) / 'bin' / 'activate'))}",
                        f"export PYTHONPATH={shlex.quote(str(tmp_path))}",
                    ],
                },
            }
        )
    )
    out = render(tmp_path, "configs/demo.yaml", str(site), f"run_dir={run}", "extract.num_tasks=2")
    (run / "prepared").mkdir(parents=True)
    (run / "prepared" / "plan.json").write_text(json.dumps({"num_tasks": 2, "tasks": []}))
    r = subprocess.run(
        ["bash", str(out / "submit.sh"), "--no-prepare", "--no-train"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    array = r.stdout.strip().splitlines()[-1]
    _wait_gone(array, 600)

    logs = "\n".join(p.read_text()[-2000:] for p in (run / "slurm").glob(f"{array}_*/*_log.*"))
    st0, st1 = read_state(run, 0), read_state(run, 1)
    assert st0.status == "done" and st1.status == "done", logs
    # Task 0: checkpointed at the signal, requeued by the script, done on restart 1; no failure counted.
    assert [a.outcome for a in st0.attempts] == ["checkpointed", "done"], logs
    assert [a.restart for a in st0.attempts] == [0, 1] and st0.failures == 0
    # Task 1: raised, requeued because 1 failure < slurm.max_attempts, done on the next attempt.
    assert [a.outcome for a in st1.attempts] == ["error", "done"], logs
    assert st1.failures == 1 and "planned failure" in st1.last_error
    assert "requeueing" in logs
    # --open-mode=append: the requeued attempt added to the first attempt's log instead of replacing it.
    log0 = (run / "slurm" / f"{array}_0" / f"{array}_0_0_log.err").read_text()
    assert "restart 0" in log0 and "got the checkpoint signal" in log0 and "restart 1" in log0

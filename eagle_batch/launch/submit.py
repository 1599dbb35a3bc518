"""Build a submitit executor from `cfg.slurm` and submit extraction arrays and dependent jobs.

- `make_executor(cfg, run_dir, kind)`: a Slurm executor, resources and container wrapping from the config.
- `submit_tasks(cfg, run_dir, task_ids, kind)`: arrays of `ArrayTask`s on Slurm (several when the tasks
  exceed MaxArraySize, `launch.slurm_arrays`), or the local executor's slots (`launch.local`); records the
  submission in RUN/slurm/submissions.jsonl (one line per array).
- `submit_after(run_dir, fn, *args)`: one job that waits (`afterok`) for the run's unfinished extraction
  arrays, aggregates the task stores, then calls `fn(*args)` (used by `train --after RUN` and
  `extract --then-train`).

Containers (`slurm.container.runtime`):
- `apptainer`: submitit's `python` command becomes `apptainer exec --nv --bind ... IMAGE python3`, so the
  task's Python runs inside the image while sbatch/srun stay on the host.
- `pyxis`: srun gets `--container-image=IMAGE --container-mounts=...` and the task runs `python3` in it.
The run, model, tokenizer and data folders are bound at the same path; `binds` add more. The image must
have eagle-batch installed (see container/).
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import submitit

from eagle_batch import environment

from . import state as S
from .job import host_requeue_setup
from .slurm_arrays import max_array_tasks, share_parallelism, split_tasks
from .slurm_fit import check_request_fits
from .slurm_query import controller_answers, have_slurm, is_live
from .state import SubmitError, plan_num_tasks
from .task import ArrayTask


def resolve_executor(cfg) -> str:
    ex = cfg.slurm.executor
    if ex == "auto":
        # auto picks Slurm only when a controller answers: sbatch on PATH with slurmctld down would
        # queue nothing and fail at submit.
        return "slurm" if have_slurm() and controller_answers() else "local"
    if ex == "slurm" and not have_slurm():
        raise SubmitError(
            "slurm.executor=slurm but sbatch/squeue are not on PATH; run on a Slurm login node, "
            "or set slurm.executor=local to run the tasks on this machine."
        )
    if ex not in ("slurm", "local"):
        raise SubmitError(f"slurm.executor={ex!r} is not one of auto, slurm, local.")
    return ex


def _parse_sbatch_lines(lines: Sequence[str]) -> dict[str, Any]:
    """`slurm.additional_sbatch` entries ("--mail-type=END", "#SBATCH --reservation x", "hint=nomultithread")."""
    out: dict[str, Any] = {}
    for raw in lines:
        line = raw.strip()
        if line.startswith("#SBATCH"):
            line = line[len("#SBATCH") :].strip()
        line = line.lstrip("-")
        if not line:
            continue
        if "=" in line:
            k, v = line.split("=", 1)
        elif " " in line:
            k, v = line.split(None, 1)
        else:
            k, v = line, True  # a flag such as --requeue
        out[k.strip()] = v.strip() if isinstance(v, str) else v
    return out


def _binds(cfg, run_dir: Path) -> list[str]:
    paths = [str(run_dir.resolve())]
    for p in (cfg.model.path, cfg.model.tokenizer):
        if p:
            paths.append(str(Path(p).resolve()))
    for p in cfg.data.inputs:
        base = Path(p.split("*")[0] or ".")
        paths.append(str((base if base.is_dir() else base.parent).resolve()))
    seen, out = set(), []
    for p in paths:
        if p not in seen:
            seen.add(p)
            out.append(f"{p}:{p}")
    return out + list(cfg.slurm.container.binds)


def container_wrapping(cfg, run_dir: Path) -> tuple[str | None, list[str]]:
    """(python command, extra srun args) for `slurm.container`."""
    c = cfg.slurm.container
    if c.runtime == "none":
        return None, []
    if not c.image:
        raise SubmitError(
            f"slurm.container.runtime={c.runtime} needs slurm.container.image (an .sif file for "
            "apptainer, an image name or .sqsh for pyxis)."
        )
    binds = _binds(cfg, run_dir)
    if c.runtime == "apptainer":
        args = ["apptainer", "exec", "--nv"]
        for b in binds:
            args += ["--bind", b]
        args += list(c.extra_args) + [c.image, "python3"]
        return shlex.join(args), []
    if c.runtime == "pyxis":
        srun = [
            f"--container-image={c.image}",
            "--container-mounts=" + ",".join(binds),
            "--no-container-mount-home",
        ] + list(c.extra_args)
        return "python3", srun
    raise SubmitError(f"slurm.container.runtime={c.runtime!r} is not one of none, apptainer, pyxis.")


def check_slurm_request(cfg, executor: str | None = None, tasks_per_node: int = 1) -> None:
    """When the run goes to Slurm: ConfigError now if no node of the partition can take its tasks (the
    check make_executor repeats at submission), so a command fails before it plans or writes anything."""
    if (executor or resolve_executor(cfg)) == "slurm":
        sc = cfg.slurm
        options = {k.replace("_", "-") for k in _parse_sbatch_lines(sc.additional_sbatch)}
        check_request_fits(sc, options, tasks_per_node)


class CheckedSlurmExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor whose batch step checks the job folder is the submitter's own before it
    unpickles the job (launch.submitit_entry)."""

    @property
    def _submitit_command_str(self) -> str:
        return " ".join([self.python, "-u -m eagle_batch.launch.submitit_entry", shlex.quote(str(self.folder))])


def make_executor(
    cfg,
    run_dir: str | os.PathLike,
    kind: str = "extract",
    job_name: str = "",
    dependency: str = "",
    executor: str | None = None,
    check_fits: bool = True,
    tasks_per_node: int = 1,
):
    """A submitit SlurmExecutor with the run's resources (local runs go through `launch.local`). With
    `check_fits` a request no node of the partition can meet is a ConfigError here, before any submission
    (launch.slurm_fit); without it the executor is only built (to read its batch script)."""
    run_dir = Path(run_dir)
    which = executor or resolve_executor(cfg)
    if which != "slurm":
        raise SubmitError(
            f"make_executor builds Slurm executors; executor {which!r} runs through "
            "eagle_batch.launch.local.submit_local."
        )
    folder = run_dir / S.SLURM_DIR / "%j"
    sc = cfg.slurm
    if check_fits:
        check_slurm_request(cfg, "slurm", tasks_per_node)
    python, srun_args = container_wrapping(cfg, run_dir)
    S.slurm_dir(run_dir)  # 0700 before submitit writes a pickle there
    ex = CheckedSlurmExecutor(folder=folder, max_num_timeout=sc.max_num_timeout, python=python)
    params: dict[str, Any] = dict(
        job_name=job_name or f"eb-{kind}-{run_dir.name}",
        time=sc.time_min,
        nodes=sc.nodes,
        # Extraction: one process per array task (vLLM starts its own TP workers); training: one rank per GPU.
        ntasks_per_node=tasks_per_node,
        cpus_per_task=sc.cpus_per_task,
        array_parallelism=sc.array_parallelism,
        signal_delay_s=sc.signal_delay_s,
        stderr_to_stdout=False,
    )
    if sc.gpus_per_node > 0:
        params["gpus_per_node"] = sc.gpus_per_node
    if sc.mem_gb > 0:
        params["mem"] = f"{sc.mem_gb}GB"
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(sc, key):
            params[key] = getattr(sc, key)
    if sc.exclusive:
        params["exclusive"] = True
    setup = list(sc.setup)
    if sc.container.runtime != "none" or environment.host_requeue_requested_at_submit():
        # The task runs in a container that usually lacks `scontrol`: it leaves a request file and this
        # batch script (on the host) requeues the job after srun returns (launch.job).
        host_setup, params["teardown"] = host_requeue_setup(run_dir.resolve() / S.SLURM_DIR / "requeue")
        setup = host_setup + setup
    if setup:
        params["setup"] = setup
    if srun_args:
        params["srun_args"] = srun_args
    extra = _parse_sbatch_lines(sc.additional_sbatch)
    if dependency:
        params["dependency"] = dependency
    if extra:
        params["additional_parameters"] = extra
    ex.update_parameters(**params)
    return ex


def live_tasks(run_dir: str | os.PathLike) -> dict[int, str]:
    """{task_id: job id} for tasks whose latest extraction job is still queued or running (Slurm or local)."""
    from .status import ACTIVE, task_rows

    if not any(s.kind in ("extract", "resume") for s in S.read_submissions(run_dir)):
        return {}
    return {
        r.task_id: r.job_id
        for r in task_rows(run_dir, plan_num_tasks(run_dir))
        if r.state in ACTIVE or is_live(r.slurm_state)
    }


def submit_tasks(
    cfg, run_dir: str | os.PathLike, task_ids: Sequence[int], kind: str = "extract", executor: str | None = None
) -> S.Submission:
    """Submit ArrayTask(run_dir, t) for t in task_ids; refuse tasks already live. Returns the submission's
    (first) record; on Slurm, `arrays` names every array when there are several."""
    run_dir = Path(run_dir).resolve()  # the jobs may start elsewhere (another cwd, a compute node)
    task_ids = sorted(int(t) for t in task_ids)
    if not task_ids:
        raise SubmitError(f"no tasks to submit for {run_dir}.")
    live = live_tasks(run_dir)
    clash = {t: live[t] for t in task_ids if t in live}
    if clash:
        shown = ", ".join(f"task {t} (job {j})" for t, j in list(clash.items())[:5])
        raise SubmitError(
            f"{run_dir} already has {len(clash)} of these tasks queued or running: {shown}"
            f"{' ...' if len(clash) > 5 else ''}. Nothing was submitted. Follow them with "
            f"`eagle-batch status {run_dir}`, or stop them with `eagle-batch cancel {run_dir}` "
            "before submitting again."
        )
    which = executor or resolve_executor(cfg)
    if which == "local":
        from .local import LocalResourceError, submit_local

        try:
            sub = submit_local(cfg, run_dir, task_ids, kind)
        except LocalResourceError as e:
            raise SubmitError(f"{e} Nothing was submitted.") from None
        S.append_submission(run_dir, sub)
        return sub
    return _submit_arrays(cfg, run_dir, task_ids, kind, which)


def _submit_arrays(cfg, run_dir: Path, task_ids: list[int], kind: str, which: str) -> S.Submission:
    """The tasks as one or more Slurm arrays (launch.slurm_arrays: at most the cluster's MaxArraySize each,
    sharing slurm.array_parallelism). Each array is recorded as soon as sbatch took it, so a failure part-way
    leaves no array unknown to `status`; the records of one submission share `group` (the first array's id).
    Returns the first array's record."""
    parts = split_tasks(task_ids, max_array_tasks(cfg.slurm.max_array_size))
    ex = make_executor(cfg, run_dir, kind=kind, executor=which)
    subs: list[S.Submission] = []
    for part, parallelism in zip(parts, share_parallelism(cfg.slurm.array_parallelism, len(parts)), strict=True):
        ex.update_parameters(array_parallelism=parallelism)
        try:
            # Submit task *instances* (callables without arguments): submitit checkpoints and requeues the
            # callable it ran, which must be the Checkpointable itself. One batch = one array.
            with ex.batch():
                pending = [ex.submit(ArrayTask(str(run_dir), t)) for t in part]
        except Exception as e:
            if not subs:
                raise
            raise SubmitError(
                f"{len(subs)} of {len(parts)} arrays of {run_dir} were submitted ({', '.join(s.job_id for s in subs)}: "
                f"{sum(len(s.tasks) for s in subs)} tasks); the next failed: {type(e).__name__}: {e}. "
                f"`eagle-batch resume {run_dir}` submits the tasks left out."
            ) from None
        first = str(pending[0].job_id)
        job_id = first.split("_")[0]
        sub = S.Submission(
            job_id=job_id,
            executor="slurm",
            tasks=part,
            time=time.time(),
            kind=kind,
            folder=str(run_dir / S.SLURM_DIR),
            array="_" in first,
            group=subs[0].job_id if subs else (job_id if len(parts) > 1 else ""),
        )
        S.append_submission(run_dir, sub)
        subs.append(sub)
    return subs[0]


def _aggregate_then(run_dir: str, fn: Callable, args: tuple, kwargs: dict, aggregate: bool):
    if aggregate:
        from eagle_batch.store import aggregate as agg

        agg(run_dir)
    return fn(*args, **kwargs)


def submit_after(
    run_dir: str | os.PathLike,
    fn: Callable,
    *args: Any,
    name: str = "train",
    aggregate: bool = True,
    cfg=None,
    slurm_overrides: Sequence[str] = (),
    **kwargs: Any,
) -> S.Submission:
    """Submit `fn(*args, **kwargs)` as one Slurm job that starts after the run's extraction succeeds.

    For any job that needs the run's hidden states (training builds its own array with
    `make_executor(..., dependency=afterok_dependency(RUN))`, launch.train_job):

        from eagle_batch.launch import submit_after
        sub = submit_after(run_dir, train_main, cfg_path, overrides, slurm_overrides=["slurm.gpus_per_node=8"])
        print(f"training job {sub.job_id} waits for {sub.dependency or 'nothing (extraction is done)'}")

    - Dependency: `afterok:` on the latest array job of every task not yet done (so it also follows a
      `resume`); none if all tasks are done. If a task fails for good the job never starts (Slurm shows
      DependencyNeverSatisfied): fix the task, `eagle-batch resume RUN`, then submit training again.
    - In the job: `eagle_batch.store.aggregate(run_dir)` first (unless aggregate=False), then `fn`.
    - Resources: the run's `slurm` section (RUN/config.yaml, or `cfg`) plus `slurm_overrides`
      (`key=value`, e.g. `slurm.time_min=600`); `fn` and its arguments must be picklable.
    - Recorded in RUN/slurm/submissions.jsonl with kind=name. Returns that Submission.
    """
    from eagle_batch.config import load_run_config

    run_dir = Path(run_dir)
    if cfg is None:
        cfg = load_run_config(run_dir, slurm_overrides)
    dependency = afterok_dependency(run_dir)
    which = resolve_executor(cfg)
    if which != "slurm":
        raise SubmitError(
            "chaining (train --after / extract --then-train) needs Slurm: set slurm.executor=slurm "
            "on a machine with sbatch, or run `eagle-batch train` after extraction finishes."
        )
    ex = make_executor(cfg, run_dir, kind=name, dependency=dependency, executor=which)
    job = ex.submit(_aggregate_then, str(run_dir), fn, tuple(args), dict(kwargs), aggregate)
    sub = S.Submission(
        job_id=str(job.job_id),
        executor="slurm",
        tasks=[],
        time=time.time(),
        kind=name,
        folder=str(run_dir / S.SLURM_DIR),
        dependency=dependency,
    )
    S.append_submission(run_dir, sub)
    return sub


def afterok_dependency(run_dir: str | os.PathLike) -> str:
    """Slurm `--dependency` value for "after this run's extraction succeeds" ("" when all tasks are done)."""
    deps = sorted(set(pending_arrays(Path(run_dir))))
    return "afterok:" + ":".join(deps) if deps else ""


def first_start_dependency(run_dir: str | os.PathLike) -> str:
    """Slurm `--dependency` value for "once the first unfinished task of this run's extraction has started"
    (a pipelined training waits inside for committed samples; "" when every task is done)."""
    subs = S.read_submissions(Path(run_dir))
    for t in range(plan_num_tasks(Path(run_dir))):
        st = S.read_state(Path(run_dir), t)
        if st is not None and st.status == S.DONE:
            continue
        s = S.latest_submission_of(subs, t)
        if s is None:
            raise SubmitError(
                f"task {t} of {run_dir} was never submitted and is not done: run `eagle-batch extract` (or "
                f"`resume {run_dir}`) before chaining a pipelined training."
            )
        return f"after:{s.task_job_id(t)}" if s.executor == "slurm" else ""
    return ""


def pending_arrays(run_dir: Path) -> list[str]:
    """Array job ids whose tasks are not all done (the latest submission of each unfinished task)."""
    from .run_view import RunView
    from .status import latest_submissions

    n = plan_num_tasks(run_dir)
    view = RunView.read(run_dir, n)  # two directory reads and one open per state file, not a stat per task
    latest = latest_submissions(view.submissions)
    out = []
    for t in range(n):
        st = view.states.get(t)
        if st is not None and st.status == S.DONE:
            continue
        s = latest[t][0] if t in latest else None
        if s is None:
            raise SubmitError(
                f"task {t} of {run_dir} was never submitted and is not done: run "
                f"`eagle-batch extract` (or `resume {run_dir}`) before chaining training."
            )
        if s.executor == "slurm":
            out.append(s.job_id)
    return out

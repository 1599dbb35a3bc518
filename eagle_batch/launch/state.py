"""Per-task state files (RUN/state/task-XXXXX.json) and the submissions log (RUN/slurm/submissions.jsonl).

Only the task process that holds its store's writer lock writes its state file (atomic replace), so a
reader never sees half a file and two writers never race. The submissions log is appended by the CLI
(one JSON line per `sbatch`), and maps Slurm array indices back to task ids: a `resume` array holds only
some tasks, so array index i is `tasks[i]` of that line, not task i.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle_batch.errors import UserError
from eagle_batch.ownership import check_private, open_private, private_dir, write_private

from . import state_journal


class SubmitError(UserError, RuntimeError):
    """A submission that must not go ahead; the message names the run and the fix."""


class StateFileError(UserError, RuntimeError):
    """A state file that does not parse (the task writes them atomically: someone edited it)."""


def plan_num_tasks(run_dir: str | os.PathLike) -> int:
    p = Path(run_dir) / "prepared" / "plan.json"
    if not p.is_file():
        raise SubmitError(f"{p} does not exist: run `eagle-batch prepare CONFIG run_dir={run_dir}` first.")
    try:
        return int(json.loads(p.read_text())["num_tasks"])
    except (ValueError, KeyError, TypeError) as e:
        raise SubmitError(
            f"{p} is not a plan prepare wrote ({type(e).__name__}: {e}); run `eagle-batch prepare "
            f"CONFIG run_dir={run_dir} --force` again."
        ) from None


STATE_DIR = "state"
SLURM_DIR = "slurm"
SUBMISSIONS = "submissions.jsonl"

# Values of TaskState.status (written by the task itself).
RUNNING = "running"  # an attempt is running
CHECKPOINTED = "checkpointed"  # committed on the pre-timeout signal and requeued itself
RETRYING = "retrying"  # an attempt raised; requeued for another attempt (failures < max_attempts)
DONE = "done"  # every sample committed and the store finalized
FAILED = "failed"  # an attempt raised and the task was not requeued (local executor, or requeue failed)
GAVE_UP = "gave_up"  # failed on max_attempts attempts
NO_SPACE = "no_space"  # stopped on a full disk (or quota), committed work kept; not retried: `resume` once freed
REFUSED = "refused"  # (never written to the state file: a duplicate task only logs it)


def slurm_dir(run_dir: str | os.PathLike) -> Path:
    """RUN/slurm, created owner-only (0700): submitit's pickled jobs, which the batch step unpickles and runs
    as you, and the local executor's slot files, whose pids `cancel` signals."""
    return private_dir(Path(run_dir) / SLURM_DIR, "the run's submitit jobs and slot files")


def state_path(run_dir: str | os.PathLike, task_id: int) -> Path:
    return Path(run_dir) / STATE_DIR / f"task-{task_id:05d}.json"


def repair_path(run_dir: str | os.PathLike, task_id: int) -> Path:
    """A repair request written by `resume --repair` (the verify problems); removed once the task is done."""
    return Path(run_dir) / STATE_DIR / f"repair-{task_id:05d}.json"


def store_path(run_dir: str | os.PathLike, task_id: int) -> Path:
    return Path(run_dir) / "stores" / f"task-{task_id:05d}.zarr"


@dataclass
class Attempt:
    job_id: str  # Slurm "ARRAY_INDEX" id, or "local-ID_TASK" (launch.local)
    restart: int  # SLURM_RESTART_COUNT
    host: str
    pid: int
    started: float
    ended: float | None = None
    outcome: str = RUNNING  # running | checkpointed | done | error | killed (seen dead by a later attempt)
    log: str = ""  # stdout/stderr path of this attempt
    error: str = ""  # last line of the exception, if it raised
    ticks: int = 0  # the process's start time (launch.proc): with pid, tells it from a later reuse of the pid


@dataclass
class TaskState:
    task_id: int
    status: str = RUNNING
    attempts: list[Attempt] = field(default_factory=list)
    failures: int = 0  # attempts that raised (time-limit requeues do not count)
    samples_total: int = 0
    tokens_total: int = 0
    samples_committed: int = 0
    tokens_committed: int = 0
    # tokens committed by the current attempt, and its rate from its first commit on (0 until a second
    # commit: the engine's start-up would make an earlier rate meaningless); a resumed attempt's rate counts
    # only its own commits.
    attempt_tokens: int = 0
    tok_s: float = 0.0
    updated: float = 0.0
    last_error: str = ""
    last_error_log: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "TaskState":
        d = dict(d)
        d["attempts"] = [Attempt(**a) for a in d.get("attempts", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def read_state(run_dir: str | os.PathLike, task_id: int) -> TaskState | None:
    p = state_path(run_dir, task_id)
    check_private(p.parent, "the run's task state files")
    try:
        return TaskState.from_json(json.loads(p.read_text()))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, TypeError) as e:
        # Written by atomic replace, so this means someone edited it by hand.
        raise StateFileError(f"{p} is not a valid task state file ({e}); delete it to let the task rewrite it") from e


def write_state(run_dir: str | os.PathLike, st: TaskState, use_reserve: bool = False) -> None:
    """Replace the task's state file atomically. `use_reserve`: on a full disk, give back the task's reserve
    (reserve_room) and try once more, so that an attempt that ends on a full disk still records why."""
    p = state_path(run_dir, st.task_id)
    private_dir(p.parent, "the run's task state files")
    st.updated = time.time()
    text = json.dumps(st.to_json(), indent=1)
    try:
        _replace(p, text)
    except OSError as e:
        if not (use_reserve and e.errno in (errno.ENOSPC, errno.EDQUOT) and release_reserve(run_dir, st.task_id)):
            raise
        _replace(p, text)
    # After the replace: the journal is news of state files that exist (state_journal.py); best effort.
    state_journal.append(p.parent, st.to_json())


def _replace(p: Path, text: str) -> None:
    try:
        write_private(p, text)  # owner-only: state files are the run's control plane
    except OSError:
        # a half-written temporary file would hold the space the retry needs
        p.with_name(f".{p.name}.{os.getpid()}.tmp").unlink(missing_ok=True)
        raise


# A state file holds at most HISTORY_POINTS (launch.task) throughput points and one entry per attempt: a few
# tens of kB. Random bytes, not zeros: a compressing filesystem would store zeros in nothing.
RESERVE_BYTES = 256 * 1024


def reserve_path(run_dir: str | os.PathLike, task_id: int) -> Path:
    return Path(run_dir) / STATE_DIR / f".reserve-{task_id:05d}"


def reserve_room(run_dir: str | os.PathLike, task_id: int) -> bool:
    """Set aside RESERVE_BYTES beside the task's state file while an attempt runs (best effort: False when
    the disk is already too full). When the run's filesystem fills, the attempt gives it back to record its end."""
    p = reserve_path(run_dir, task_id)
    try:
        if p.is_file() and p.stat().st_size >= RESERVE_BYTES:
            return True
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as f:
            f.write(os.urandom(RESERVE_BYTES))
            f.flush()
            os.fsync(f.fileno())
        return True
    except OSError:
        p.unlink(missing_ok=True)
        return False


def release_reserve(run_dir: str | os.PathLike, task_id: int) -> bool:
    """Remove the task's reserve; True when there was one (its space is free again)."""
    try:
        reserve_path(run_dir, task_id).unlink()
        return True
    except OSError:
        return False


def new_attempt(job_id: str, restart: int, log: str) -> Attempt:
    from .proc import start_ticks

    return Attempt(
        job_id=job_id,
        restart=restart,
        host=socket.gethostname(),
        pid=os.getpid(),
        started=time.time(),
        log=log,
        ticks=start_ticks(os.getpid()),
    )


# ------------------------------------------------------------------------------------------ submissions
@dataclass
class Submission:
    job_id: str  # the array's job id (Slurm) or "local-ID" (launch.local; its folder RUN/slurm/local-ID)
    executor: str  # slurm | local
    tasks: list[int]  # array index i runs tasks[i]
    time: float
    kind: str = "extract"  # extract | resume | train
    folder: str = ""  # submitit folder (logs)
    dependency: str = ""
    # submitit submits a batch of one as a plain job, not an array: its task's job id has no "_index".
    array: bool = True
    # local executor: the GPUs of each slot ("" = CPU), and what the user was told about that choice
    devices: list[str] = field(default_factory=list)
    note: str = ""
    # Slurm: the first array's job id when one submission was split into several arrays (more tasks than
    # MaxArraySize, launch.slurm_arrays); every array of that submission has it. "" for a single array.
    group: str = ""

    def task_job_id(self, task_id: int) -> str:
        if self.executor == "local":
            return f"{self.job_id}_{task_id}"  # what launch.local names the task's attempts
        idx = self.tasks.index(task_id)
        return f"{self.job_id}_{idx}" if self.array else f"{self.job_id}"


def append_submission(run_dir: str | os.PathLike, sub: Submission) -> None:
    p = slurm_dir(run_dir) / SUBMISSIONS
    # One short line with O_APPEND: concurrent CLIs never interleave inside a line.
    with os.fdopen(open_private(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a") as f:
        f.write(json.dumps(asdict(sub)) + "\n")


def read_submissions(run_dir: str | os.PathLike) -> list[Submission]:
    p = Path(run_dir) / SLURM_DIR / SUBMISSIONS
    check_private(p.parent, "the run's submitit jobs and slot files")
    if not p.is_file():
        return []
    out = []
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        if line.strip():
            try:
                d = json.loads(line)
                out.append(Submission(**{k: v for k, v in d.items() if k in Submission.__dataclass_fields__}))
            except (ValueError, TypeError) as e:  # appended in whole lines by the CLI: edited by hand
                raise StateFileError(
                    f"{p}:{lineno} is not a submission record ({e}); restore or delete that line"
                ) from None
    return out


def arrays_of(subs: list[Submission], sub: Submission) -> list[str]:
    """Job ids of every array submitted together with `sub` (itself alone when it was not split)."""
    return [s.job_id for s in subs if s.group == sub.group] if sub.group else [sub.job_id]


def latest_submission_of(
    subs: list[Submission], task_id: int, kind: tuple[str, ...] = ("extract", "resume")
) -> Submission | None:
    for s in reversed(subs):
        if s.kind in kind and task_id in s.tasks:
            return s
    return None

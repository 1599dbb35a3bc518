"""Ask Slurm for job states: squeue for live jobs, sacct for finished ones.

Array tasks come back as `ARRAY_INDEX` ids; a pending array still held as one record comes back as
`ARRAY_[2-5,7%4]` and is expanded here, so callers can always look up `f"{array}_{index}"`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable

LIVE = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "RESV_DEL_HOLD",
}


def have_slurm() -> bool:
    return shutil.which("sbatch") is not None and shutil.which("squeue") is not None


def controller_answers(timeout_s: float = 10.0) -> bool:
    """True when a slurmctld answers `scontrol ping`: installed client tools alone (a workstation with
    the slurm-client package, a node whose controller is down) are not a cluster to submit to."""
    if shutil.which("scontrol") is None:
        return False
    try:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and " is UP" in r.stdout


def _expand(job_id: str) -> list[str]:
    m = re.fullmatch(r"(\d+)_\[([^\]]+)\]", job_id)
    if not m:
        return [job_id]
    base, spec = m.group(1), m.group(2).split("%")[0]
    out = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += [f"{base}_{i}" for i in range(int(a), int(b) + 1)]
        elif part:
            out.append(f"{base}_{part}")
    return out


def _run(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout if r.returncode == 0 else ""


def job_states(array_ids: Iterable[str]) -> dict[str, str]:
    """{"ARRAY_INDEX" or "JOB": STATE} for the given arrays/jobs; live states (squeue) win over sacct."""
    ids = sorted({str(a) for a in array_ids if a and not str(a).startswith("local")})
    if not ids or not have_slurm():
        return {}
    out: dict[str, str] = {}
    joined = ",".join(ids)
    # sacct first (history), then squeue overrides with what is live now. -X: allocations only.
    for line in _run(["sacct", "-n", "-X", "-P", "-j", joined, "-o", "JobID,State"]).splitlines():
        parts = line.split("|")
        if len(parts) >= 2:
            state = parts[1].split()[0]  # "CANCELLED by 0" -> CANCELLED
            for jid in _expand(parts[0]):
                out[jid] = state
    for line in _run(["squeue", "-h", "-r", "-j", joined, "-o", "%i|%T"]).splitlines():
        parts = line.split("|")
        if len(parts) == 2:
            for jid in _expand(parts[0]):
                out[jid] = parts[1]
    return out


def is_live(state: str) -> bool:
    return state in LIVE


# Pending reasons under which a job never starts on its own: its request is beyond what its partition,
# account or QOS allows a single job, or it waits on a dependency that can no longer be met. (Resources,
# Priority, ReqNodeNotAvail, group-wide limits and the like pass with time.)
NEVER_STARTS = {
    "PartitionConfig": "the request does not fit the partition",
    "BadConstraints": "no node has the features slurm.constraint asks for",
    "PartitionNodeLimit": "more nodes than the partition allows a job",
    "PartitionTimeLimit": "more time than the partition allows (slurm.time_min)",
    "InvalidAccount": "slurm.account is not an account you may use",
    "InvalidQOS": "slurm.qos is not a QOS you may use",
    "DependencyNeverSatisfied": "the job it waits for ended without success",
}


def never_starts(reason: str) -> str:
    """Why a job pending for `reason` will not start on its own ("" when it may): NEVER_STARTS and the
    per-job limits of an account or QOS (e.g. QOSMaxGRESPerJob), which the job's own request exceeds."""
    if reason in NEVER_STARTS:
        return NEVER_STARTS[reason]
    if re.fullmatch(r"(Assoc|QOS)\w*PerJob\w*", reason):
        return "the request is above a per-job limit of the account or QOS"
    return ""


def pending_reasons(array_ids: Iterable[str]) -> dict[str, str]:
    """{"ARRAY_INDEX" or "JOB": reason} for the pending jobs among the given arrays/jobs (squeue's %r)."""
    ids = sorted({str(a) for a in array_ids if a and not str(a).startswith("local")})
    if not ids or not have_slurm():
        return {}
    out: dict[str, str] = {}
    for line in _run(["squeue", "-h", "-r", "-t", "PENDING", "-j", ",".join(ids), "-o", "%i|%r"]).splitlines():
        parts = line.split("|")
        if len(parts) == 2:
            for jid in _expand(parts[0]):
                out[jid] = parts[1].strip()
    return out

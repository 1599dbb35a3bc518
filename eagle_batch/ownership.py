"""The run's control plane is yours alone: what eagle-batch executes, unpickles or signals from a run folder.

A run folder holds two kinds of things. Its *control plane* (RUN itself, RUN/config.yaml, which names code
to run (`extract.work`) and shell lines (`slurm.setup`); RUN/slurm/, submitit's pickled jobs and the local
executor's slot files with the pids `cancel` signals; RUN/state/; the training checkpoints) decides what
runs as you. Its *data* (task stores, dataset.json, exported drafts, reports) is only read. On a shared
file system with `umask 002` and a project group, a control file another member can write is code that
member runs as you. So, like OpenSSH with a `~/.ssh` others can write:

- the control plane is created owner-only whatever the umask (folders 0700, files 0600; RUN itself loses
  group/other write but stays readable, so the group can still read the data);
- every command that reads a run refuses, in one line naming the path, its owner and mode, a control
  file or folder that is a symbolic link, belongs to another user, or that group or others can write.

Data keeps following the umask: group members can read (and, with `umask 002`, share) the stores.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from eagle_batch.errors import UserError

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class ControlPlaneError(UserError):
    """A control file or folder of a run that someone other than its owner can change."""

    exit_code = 2


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_private(path: str | os.PathLike, what: str, mode: bool = True, follow: bool = False) -> None:
    """ControlPlaneError unless `path` (when it exists) is not a link, is owned by this user and (with
    `mode`) is writable by its owner alone. `what` says what it is ("the run's config", ...) in the message;
    `mode=False` is for what lies inside a folder checked with it (the folder keeps others out); `follow`
    checks what a link points at instead of refusing the link (RUN itself may be a link to scratch)."""
    p = Path(path)
    try:
        st = os.stat(p) if follow else os.lstat(p)
    except FileNotFoundError:
        return
    me = os.geteuid()
    bits = stat.S_IMODE(st.st_mode)
    problem = ""
    if stat.S_ISLNK(st.st_mode):
        problem = f"is a symbolic link (to {os.readlink(p)})"
    elif st.st_uid != me:
        problem = f"belongs to {_owner_name(st.st_uid)}, not to you ({_owner_name(me)})"
    elif mode and bits & 0o022:
        problem = "can be written by " + (
            "its group and others" if bits & 0o022 == 0o022 else "its group" if bits & 0o020 else "others"
        )
    if problem:
        raise ControlPlaneError(
            f"{p} ({what}; owner {_owner_name(st.st_uid)}, mode {bits:04o}) {problem}: eagle-batch runs what "
            "it says as you, so it must be yours and writable by you alone. If you made it, "
            f"`chmod go-w {p}`; otherwise someone else changed your run: inspect it, then remove it."
        )


def make_run_dir(run_dir: str | os.PathLike) -> Path:
    """Create RUN (and its parents) and make it group/other read-only: the umask's read bits stay (the group
    reads the data), write bits go (nobody else can swap RUN/config.yaml or RUN/slurm). A RUN of another
    user is refused."""
    p = Path(run_dir)
    p.mkdir(parents=True, exist_ok=True)
    st = os.stat(p)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o022)
    check_private(p, "the run folder", follow=True)
    return p


def private_dir(path: str | os.PathLike, what: str) -> Path:
    """Create `path` (and missing parents, which follow the umask) as a 0700 folder; an existing one must
    already be private (check_private), except that one of ours that is merely too open is tightened."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(p, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    st = os.lstat(p)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(p, PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask; a folder of ours made earlier
    check_private(p, what)
    return p


def open_private(path: str | os.PathLike, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """An fd of `path` opened without following a link and chmod 0600 whatever the umask."""
    fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `path` atomically as a 0600 file (a fresh temporary next to it, then rename)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, p)
    return p


# The control entries of a run (relative to RUN) and what each is, checked by every command that reads it.
RUN_CONTROL = (
    ("config.yaml", "the run's config"),
    ("slurm", "the run's submitit jobs and slot files"),
    ("state", "the run's task state files"),
)


def check_run(run_dir: str | os.PathLike) -> None:
    """ControlPlaneError unless RUN and its control entries that exist are private (check_private)."""
    run = Path(run_dir)
    check_private(run, "the run folder", follow=True)
    for name, what in RUN_CONTROL:
        check_private(run / name, what)


def user_temp_dir(name: str) -> Path:
    """TMP/eagle-batch-UID/NAME, both 0700 and this user's own: the machine's temp folder is shared, and a
    fixed name there may already have been made (or planted as a link) by someone else. A folder there that
    is a link, another user's, or open to others is refused (ControlPlaneError naming it), never used."""
    import tempfile

    base = Path(tempfile.gettempdir()) / f"eagle-batch-{os.geteuid()}"
    for p in (base, base / name):
        try:
            os.mkdir(p, PRIVATE_DIR_MODE)  # never follows a link planted at p: mkdir fails on any entry there
            os.chmod(p, PRIVATE_DIR_MODE)
        except FileExistsError:
            pass
        check_private(p, "eagle-batch's per-user temporary folder")
        if not stat.S_ISDIR(os.lstat(p).st_mode):
            raise ControlPlaneError(f"{p} is not a folder; remove it (eagle-batch keeps its temporary files there).")
    return base / name


def cache_warnings(caches: dict[str, Path]) -> list[str]:
    """One line per code cache (compiled kernels, remote-code modules: imported by every job that uses it)
    that another user owns or can write: whoever can write it runs code in your jobs. Empty when each is
    yours alone, or not there yet."""
    out = []
    me = os.geteuid()
    for var, path in caches.items():
        try:
            st = os.stat(path)
        except OSError:
            continue
        bits = stat.S_IMODE(st.st_mode)
        if st.st_uid == me and not bits & 0o022:
            continue
        who = (
            f"belongs to {_owner_name(st.st_uid)}"
            if st.st_uid != me
            else "can be written by " + ("others" if bits & 0o002 else "its group")
        )
        out.append(
            f"{var}={path} (owner {_owner_name(st.st_uid)}, mode {bits:04o}) {who}: what is compiled or cached "
            "there is imported by your jobs, so whoever can write it runs code as you. Use a cache of your own "
            f"(e.g. {var}=$HOME/.cache/eagle-batch or a per-user folder on scratch), or share one only as the "
            "security guide says (docs/explanation/security.md)."
        )
    return out

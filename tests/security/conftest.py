"""Two real users of one group, for the attacks of one member on another's runs (docs/explanation/security.md).

As root (CI), the session creates the group `ebshare` and the users `ebvictim` and `ebattacker` in it when
they are missing, and a project folder of that group that its members can write (setgid, 2775), as on a
shared scratch file system. Commands run as either user through tests/security/as_user.py (a real uid
switch, umask 002 by default). Not root: every test here is skipped, saying why.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AS_USER = Path(__file__).with_name("as_user.py")
GROUP, VICTIM, ATTACKER = "ebshare", "ebvictim", "ebattacker"


@dataclass
class TwoUsers:
    base: Path  # readable by both users
    project: Path  # the group's shared, group-writable folder (2775)
    stdlib: Path
    model: Path  # the SmolLM2 tokenizer and config (no weights), readable by both

    def run(self, user: str, *args: str, umask: str = "002", env: dict | None = None, timeout: float = 600):
        """`python ARGS` (`-m module ...` or `-c code`) as `user`; the CompletedProcess."""
        full = dict(
            os.environ,
            PYTHONPATH=str(REPO),
            TMPDIR=str(self.base / "tmp"),
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            EAGLE_BATCH_CACHE=str(self.base / "home" / user / "cache"),
            **(env or {}),
        )
        return subprocess.run(
            [sys.executable, str(AS_USER), user, umask, str(self.stdlib), "--", *args],
            capture_output=True,
            text=True,
            env=full,
            cwd=str(self.base),
            timeout=timeout,
        )

    def uid(self, user: str) -> int:
        return pwd.getpwnam(user).pw_uid


def _ensure_users() -> None:
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", GROUP], check=True)
    for user in (VICTIM, ATTACKER):
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "-M", "-N", "-g", GROUP, "-s", "/bin/sh", user], check=True)


@pytest.fixture(scope="session")
def two_users(smollm2_path) -> TwoUsers:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user and switch to it (CI runs as root)")
    if not shutil.which("useradd") or not shutil.which("groupadd"):
        pytest.skip("needs useradd and groupadd to create the two users")
    for need in (REPO, Path(sysconfig.get_paths()["purelib"])):
        closed = [p for p in [need, *need.parents] if not os.stat(p).st_mode & 0o005]
        if closed:
            pytest.skip(
                f"the other users cannot read {need}: {closed[-1]} is closed to them (mode "
                f"{oct(os.stat(closed[-1]).st_mode & 0o777)}); put the checkout where others may read it"
            )
    _ensure_users()
    gid = grp.getgrnam(GROUP).gr_gid
    # Under /tmp itself, not $TMPDIR: the test users must traverse every folder above it, and the suite's
    # TMPDIR is a root-only folder (scripts/test.sh makes it with mktemp -d).
    base = Path(tempfile.mkdtemp(prefix="eb-two-users-", dir="/tmp"))
    base.chmod(0o755)
    project = base / "project"
    project.mkdir()
    os.chown(project, 0, gid)
    project.chmod(0o2775)
    tmp = base / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)  # like /tmp: anyone may create, only owners may remove
    for user in (VICTIM, ATTACKER):
        home = base / "home" / user
        home.mkdir(parents=True)
        os.chown(home, pwd.getpwnam(user).pw_uid, gid)
        home.chmod(0o700)
    (base / "home").chmod(0o755)
    # Root's interpreter lives under /root (0700): its standard library, hard-linked where others can read it.
    stdlib = base / "stdlib"
    subprocess.run(["cp", "-al", os.path.dirname(os.__file__), str(stdlib)], check=True)
    model = base / "model"
    model.mkdir()
    for f in Path(smollm2_path).iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, model / f.name)
    model.chmod(0o755)
    yield TwoUsers(base, project, stdlib, model)
    shutil.rmtree(base, ignore_errors=True)

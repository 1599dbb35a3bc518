"""Run Python code as another user: `python as_user.py USER UMASK STDLIB -- -m MODULE ARGS...` or `-c CODE`.

Started as root, it drops to USER (its uid, its primary group and that group only) and sets UMASK before
anything of eagle-batch is imported, then runs the module or code as `python -m` / `python -c` would. The
interpreter is root's own (under /root, which others cannot enter): STDLIB is a copy of its standard library
made of hard links in a folder others can read, put in place of the original on sys.path, so that what the
command imports later (json, csv, gzip ...) is found as the user.
"""

from __future__ import annotations

import os
import pwd
import runpy
import sys


def main() -> None:
    user, umask, stdlib, sep, *rest = sys.argv[1:]
    assert sep == "--", sys.argv
    pw = pwd.getpwnam(user)
    original = os.path.dirname(os.__file__)
    sys.path[:] = [p.replace(original, stdlib, 1) for p in sys.path if not p.endswith(".zip")]
    for module in list(sys.modules.values()):  # packages imported at start-up find their submodules there too
        path = getattr(module, "__path__", None)
        if isinstance(path, list):
            path[:] = [p.replace(original, stdlib, 1) for p in path]
    sys.path_importer_cache.clear()
    os.setgroups([pw.pw_gid])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    os.umask(int(umask, 8))
    os.environ.update(HOME=pw.pw_dir, USER=user, LOGNAME=user)
    if rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        assert rest[0] == "-c", rest
        sys.argv = ["-c", *rest[2:]]
        exec(compile(rest[1], "<as_user>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main()

"""Logs, state files and stores of a run hold no secret and no path outside the run beyond what the config
names, and every file is created with the user's umask.

The whole pipeline (prepare -> extract --wait with the local executor, i.e. submitit logs and pickles, the
real task in its own process -> aggregate -> status) runs in a child with umask 027 and secrets in its
environment (HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...). Then every byte of every file under RUN is searched.
The same child builds a tiny model under that umask (model folders used to be created 0700 by mkdtemp).
"""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

import faultlib as F

SECRETS = {
    "HF_TOKEN": "hf_SECRETfaulttestTOKEN123",
    "HUGGING_FACE_HUB_TOKEN": "hf_SECRETfaulttestHUB456",
    "AWS_SECRET_ACCESS_KEY": "awsSECRETfaulttestKEY789",
    "WANDB_API_KEY": "wandbSECRETfaulttest000",
}
UMASK = 0o027

CHILD = r"""
import os, sys
os.umask(0o027)
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import faultlib as F
from eagle_batch.models.tiny import build_tiny_model
base = Path(sys.argv[2])
build_tiny_model("llama", base / "model-umask", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=32)
run = base / "run"
cfg = F.write_config(base / "cfg.yaml", run, F.tiny_llama())
assert F.cli("prepare", cfg, "--workers", "1", "--no-progress") == 0
assert F.cli("extract", cfg, "--wait", "--interval", "1") == 0
assert F.cli("aggregate", run) == 0
assert F.cli("status", run) == 0
assert F.cli("verify", run) == 0
"""

PATH_RE = re.compile(rb"(?<![A-Za-z0-9._\-/])(/(?:[A-Za-z0-9._\-+@]+/)+[A-Za-z0-9._\-+@]*)")


def _real_path_outside(candidate: str) -> bool:
    """Binary data (compressed shards, parquet) is full of '/x/y' byte runs: keep what looks like a real path."""
    parts = Path(candidate).parts
    return len(parts) >= 3 and Path("/", parts[1]).is_dir()


def test_no_secrets_or_foreign_paths_and_umask_honoured(tmp_path):
    env = F.child_env(**SECRETS)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(Path(F.__file__).parent), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = tmp_path / "run"
    files = [p for p in run.rglob("*") if p.is_file()]
    assert len(files) > 50 and any(p.name.endswith("_log.err") for p in files)  # logs are really there
    assert (run / "slurm").is_dir() and (run / "state").is_dir() and (run / "dataset.json").is_file()

    # 1. No secret anywhere (logs, submitit pickles, state files, store attributes, prepared data).
    for p in files:
        data = p.read_bytes()
        for name, value in SECRETS.items():
            assert value.encode() not in data, f"{name} leaked into {p}"

    # 2. No path outside the run directory except the ones the config names (model/tokenizer, data inputs).
    allowed = [str(run), str(F.tiny_llama()), str(F.DATA)]
    foreign: dict[str, set] = {}
    for p in files:
        for m in PATH_RE.findall(p.read_bytes()):
            s = m.decode("latin-1").rstrip("/.")
            if any(s == a or s.startswith(a + "/") for a in allowed) or not _real_path_outside(s):
                continue
            foreign.setdefault(s, set()).add(str(p.relative_to(run)))
    assert not foreign, "paths outside the run that the config does not name:\n" + "\n".join(
        f"  {k}  in {sorted(v)[:3]}" for k, v in sorted(foreign.items())
    )

    # 3. Every shareable file and directory created with umask 027: files 0640 (0750 if executable), dirs 0750;
    # the run's control plane (what is executed, unpickled or signalled: config.yaml, slurm/, state/) is the
    # owner's alone whatever the umask (eagle_batch/ownership.py): files 0600, dirs 0700. What lies inside those
    # folders is behind them: its own mode may follow the umask or be the owner's alone.
    control = {run / "config.yaml", run / "slurm", run / "state"}
    bad = []
    for p in [run, *run.rglob("*"), *(tmp_path / "model-umask").rglob("*"), tmp_path / "model-umask"]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        full = 0o777 if p.is_dir() or mode & 0o100 else 0o666
        want = full & ~(0o077 if p in control else UMASK)
        if any(c in p.parents for c in control) and mode == full & ~0o077:
            continue
        if mode != want:
            bad.append(f"{oct(mode)} (want {oct(want)}) {p}")
    assert not bad, "modes not following umask 027:\n" + "\n".join(bad[:20])

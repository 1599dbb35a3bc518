"""One member of a project group attacks another's run (two real users, umask 002, a group-writable project
folder); each attack is refused or harmless, with the message the victim sees (docs/explanation/security.md).

    python -m pytest -q tests/security/
"""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest
from conftest import ATTACKER, REPO, VICTIM

CHATS = REPO / "configs" / "data" / "demo-chat.jsonl"


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


class Payload:
    """What an attacker pickles: unpickling it runs `touch MARKER` as whoever unpickles it."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def victim_run(two_users):
    """A run the victim prepared with umask 002 in the group's project folder (the real `prepare`)."""
    run = two_users.project / "run"
    data = two_users.base / "chats.jsonl"
    data.write_bytes(CHATS.read_bytes())
    data.chmod(0o644)
    r = two_users.run(
        VICTIM,
        "-m",
        "eagle_batch.cli",
        "prepare",
        str(REPO / "configs" / "demo.yaml"),
        f"run_dir={run}",
        f"model.path={two_users.model}",
        f"data.inputs=[{data}]",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    return run


def test_prepare_under_umask_002_keeps_the_control_plane_the_owners(two_users, victim_run):
    run = victim_run
    assert mode(run) & 0o022 == 0 and mode(run) & 0o055 == 0o055  # group reads the data, writes nothing
    assert mode(run / "config.yaml") == 0o600
    plan = run / "prepared" / "plan.json"
    assert mode(plan) & 0o060 == 0o060  # shareable output: as the umask says (group read/write)
    # The other member reads the data, but can neither replace the config nor add anything to the run.
    r = two_users.run(ATTACKER, "-c", f"print(len(open({str(plan)!r}).read()) > 0)")
    assert r.stdout.strip() == "True", r.stderr
    for code in (
        f"open({str(run / 'config.yaml')!r}, 'w')",
        f"open({str(run / 'evil.yaml')!r}, 'w')",
        f"import os; os.rename({str(run / 'config.yaml')!r}, {str(run / 'old.yaml')!r})",
    ):
        r = two_users.run(ATTACKER, "-c", code)
        assert r.returncode != 0 and "PermissionError" in r.stderr, (code, r.stderr)


def test_a_planted_config_is_refused_naming_path_owner_and_mode(two_users, victim_run):
    run = two_users.project / "run-planted"
    r = two_users.run(VICTIM, "-c", f"import shutil; shutil.copytree({str(victim_run)!r}, {str(run)!r})")
    assert r.returncode == 0, r.stderr
    # A run folder the group can write (made by hand, or by an earlier release): the attacker swaps the config.
    assert two_users.run(VICTIM, "-c", f"import os; os.chmod({str(run)!r}, 0o2775)").returncode == 0
    cfg = run / "config.yaml"
    r = two_users.run(
        ATTACKER,
        "-c",
        f"import os; open({str(cfg) + '.new'!r}, 'w').write('extract:\\n  work: os:system\\n')\n"
        f"os.rename({str(cfg) + '.new'!r}, {str(cfg)!r})",
    )
    assert r.returncode == 0, r.stderr
    r = two_users.run(VICTIM, "-m", "eagle_batch.cli", "status", str(run))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{run} (the run folder; owner {VICTIM}, mode 2775) can be written by its group" in r.stderr
    assert "chmod go-w" in r.stderr
    # The victim closes the folder: the config itself is still another user's, and still refused.
    assert two_users.run(VICTIM, "-c", f"import os; os.chmod({str(run)!r}, 0o2755)").returncode == 0
    r = two_users.run(VICTIM, "-m", "eagle_batch.cli", "status", str(run))
    assert r.returncode == 2
    line = f"{run / 'config.yaml'} (the run's config; owner {ATTACKER}, mode 0664) belongs to {ATTACKER}, not to you"
    assert line in r.stderr, r.stderr


SLURM_ENV = {
    "SUBMITIT_EXECUTOR": "slurm",
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "1",
    "SLURM_NODEID": "0",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_JOB_NODELIST": "localhost",
}


def test_a_replaced_submitit_pickle_is_not_run_by_the_batch_step(two_users, victim_run):
    run = two_users.project / "run-pickle"
    genuine, pwned = two_users.project / "genuine", two_users.project / "pwned"  # both may write there
    folder = run / "slurm" / "4242"
    # The victim's own job, pickled by submitit into RUN/slurm (created 0700 by eagle-batch).
    r = two_users.run(
        VICTIM,
        "-c",
        "import functools, pathlib, submitit\n"
        "from eagle_batch.ownership import make_run_dir\n"
        "from eagle_batch.launch.state import slurm_dir\n"
        f"make_run_dir({str(run)!r}); slurm_dir({str(run)!r})\n"
        f"pathlib.Path({str(folder)!r}).mkdir()\n"
        f"job = submitit.helpers.DelayedSubmission(functools.partial(pathlib.Path.touch, pathlib.Path({str(genuine)!r})))\n"
        f"job.dump(pathlib.Path({str(folder / '4242_submitted.pkl')!r}))\n",
    )
    assert r.returncode == 0, r.stderr
    assert mode(run / "slurm") == 0o700
    step = ("-m", "eagle_batch.launch.submitit_entry", str(run / "slurm" / "%j"))  # what the batch script runs
    r = two_users.run(VICTIM, *step, env=SLURM_ENV)
    assert r.returncode == 0 and genuine.exists(), r.stderr
    # The attacker cannot reach the pickles ...
    r = two_users.run(ATTACKER, "-c", f"open({str(folder / '4242_submitted.pkl')!r}, 'wb')")
    assert "PermissionError" in r.stderr
    # ... unless the run folder is open to the group: then RUN/slurm is swapped for one holding a payload.
    assert two_users.run(VICTIM, "-c", f"import os; os.chmod({str(run)!r}, 0o2775)").returncode == 0
    payload = pickle.dumps(Payload(pwned))
    r = two_users.run(
        ATTACKER,
        "-c",
        f"import os, pathlib; os.rename({str(run / 'slurm')!r}, {str(run / 'slurm-old')!r})\n"
        f"pathlib.Path({str(folder)!r}).mkdir(parents=True)\n"
        f"pathlib.Path({str(folder / '4242_submitted.pkl')!r}).write_bytes({payload!r})\n",
    )
    assert r.returncode == 0, r.stderr
    r = two_users.run(VICTIM, *step, env=SLURM_ENV)
    assert r.returncode == 3 and not pwned.exists(), r.stderr
    assert "eagle-batch: refusing to run this job:" in r.stderr
    assert f"{run} (the run folder; owner {VICTIM}, mode 2775) can be written by its group" in r.stderr
    assert two_users.run(VICTIM, "-c", f"import os; os.chmod({str(run)!r}, 0o2755)").returncode == 0
    r = two_users.run(VICTIM, *step, env=SLURM_ENV)
    assert r.returncode == 3 and not pwned.exists(), r.stderr
    want = (
        f"{run / 'slurm'} (the run's submitit jobs and slot files; owner {ATTACKER}, mode 2775) belongs to {ATTACKER}"
    )
    assert want in r.stderr, r.stderr
    # submitit's own entry, which the batch step ran before, would have run the payload as the victim.
    r = two_users.run(VICTIM, "-m", "submitit.core._submit", str(run / "slurm" / "%j"), env=SLURM_ENV)
    assert pwned.exists()


def test_a_planted_checkpoint_or_latest_is_refused_and_a_pickle_never_runs(two_users):
    out = two_users.project / "draft"
    pwned = two_users.project / "pwned-ckpt"
    ck = out / "checkpoints"
    save = (
        "import torch\n"
        "from pathlib import Path\n"
        "from eagle_batch.train.checkpoint import save_checkpoint\n"
        f"save_checkpoint(Path({str(out)!r}), {{'model': {{'w': torch.ones(2)}}, 'step': 3}})\n"
    )
    load = (
        "from pathlib import Path\n"
        "from eagle_batch.errors import UserError\n"
        "from eagle_batch.train.checkpoint import latest_checkpoint, load_checkpoint\n"
        "try:\n"
        f"    p = latest_checkpoint(Path({str(out)!r})); print('LOADED', p.name, load_checkpoint(p)['step'])\n"
        "except UserError as e:\n"
        "    print('REFUSED', e)\n"
    )
    assert two_users.run(VICTIM, "-c", save).returncode == 0
    assert mode(ck) == 0o700 and mode(ck / "step-00000003.pt") == 0o600 and mode(ck / "latest") == 0o600
    assert two_users.run(VICTIM, "-c", load).stdout.strip() == "LOADED step-00000003.pt 3"
    r = two_users.run(ATTACKER, "-c", f"open({str(ck / 'latest')!r}, 'w')")
    assert "PermissionError" in r.stderr
    # Opened to everyone by mistake: the attacker points latest outside the folder, at a payload.
    assert two_users.run(VICTIM, "-c", f"import os; os.chmod({str(ck)!r}, 0o777)").returncode == 0
    evil = two_users.base / "tmp" / "evil.pt"
    r = two_users.run(
        ATTACKER,
        "-c",
        f"open({str(evil)!r}, 'wb').write({pickle.dumps(Payload(pwned))!r})\n"
        f"open({str(ck / 'latest.new')!r}, 'w').write('../../tmp/evil.pt')\n"
        f"import os; os.rename({str(ck / 'latest.new')!r}, {str(ck / 'latest')!r})\n",
    )
    assert r.returncode == 0, r.stderr
    r = two_users.run(VICTIM, "-c", load)
    assert (
        f"REFUSED {ck} (the draft's checkpoints; owner {VICTIM}, mode 0777) can be written by its group and others"
        in r.stdout
    )
    assert two_users.run(VICTIM, "-c", f"import os; os.chmod({str(ck)!r}, 0o700)").returncode == 0
    r = two_users.run(VICTIM, "-c", load)
    assert f"REFUSED {ck / 'latest'} (the draft's latest-checkpoint pointer; owner {ATTACKER}" in r.stdout, r.stdout
    # The victim's own latest naming a path outside the folder, and a pickle the victim copied in.
    r = two_users.run(
        VICTIM,
        "-c",
        f"import os; os.unlink({str(ck / 'latest')!r}); fd = os.open({str(ck / 'latest')!r}, os.O_WRONLY | os.O_CREAT, 0o600)\n"
        "os.write(fd, b'../../tmp/evil.pt')",
    )
    r = two_users.run(VICTIM, "-c", load)
    assert f"REFUSED {ck / 'latest'} names '../../tmp/evil.pt', not a step-XXXXXXXX.pt file of {ck}" in r.stdout
    r = two_users.run(
        VICTIM,
        "-c",
        f"import os, shutil; shutil.copy({str(evil)!r}, {str(ck / 'step-00000009.pt')!r})\n"
        f"os.chmod({str(ck / 'step-00000009.pt')!r}, 0o600)\n"
        f"open({str(ck / 'latest')!r}, 'w').write('step-00000009.pt')",
    )
    r = two_users.run(VICTIM, "-c", load)
    assert "is not a plain checkpoint (tensors, numbers, strings): it holds other pickled objects" in r.stdout
    assert not pwned.exists()


def test_a_planted_temp_folder_or_link_is_refused(two_users):
    tmp = two_users.base / "tmp"
    mine = tmp / f"eagle-batch-{two_users.uid(VICTIM)}"
    hold = (
        "from eagle_batch.errors import UserError\n"
        "from eagle_batch.launch.local import _hold_devices\n"
        "try:\n"
        "    with _hold_devices(['0'], {'signal': 0}) as held: print('HELD', held)\n"
        "except UserError as e:\n"
        "    print('REFUSED', e)\n"
    )
    target = tmp / "attacker-owned"
    r = two_users.run(
        ATTACKER,
        "-c",
        f"import os; os.mkdir({str(target)!r}, 0o777); os.chmod({str(target)!r}, 0o777); os.symlink({str(target)!r}, {str(mine)!r})",
    )
    assert r.returncode == 0, r.stderr
    r = two_users.run(VICTIM, "-c", hold)
    assert (
        f"REFUSED {mine} (eagle-batch's per-user temporary folder; owner {ATTACKER}, mode 0777) is a symbolic link"
        in r.stdout
    )
    assert not any(target.iterdir())  # nothing written through the link
    r = two_users.run(ATTACKER, "-c", f"import os; os.unlink({str(mine)!r}); os.mkdir({str(mine)!r})")
    r = two_users.run(VICTIM, "-c", hold)
    assert (
        f"REFUSED {mine} (eagle-batch's per-user temporary folder; owner {ATTACKER}, mode 0775) belongs to {ATTACKER}"
        in r.stdout
    )
    r = two_users.run(ATTACKER, "-c", f"import os; os.rmdir({str(mine)!r})")
    r = two_users.run(VICTIM, "-c", hold)
    assert r.stdout.strip() == "HELD True" and mode(mine) == 0o700 and mode(mine / "devices") == 0o700


def test_dollar_paren_and_spaces_in_run_dir_are_a_literal_path_and_newlines_are_refused(two_users):
    pwned = two_users.base / "pwned-shell"
    run = two_users.project / f"my run $(touch {pwned})"
    r = two_users.run(
        VICTIM,
        "-c",
        "import runpy, sys\n"
        f"sys.argv = ['render.py', {str(REPO / 'configs' / 'demo.yaml')!r}, {'run_dir=' + str(run)!r}, "
        f"{'model.path=' + str(two_users.model)!r}, 'data.inputs=[{CHATS}]']\n"
        f"runpy.run_path({str(REPO / 'slurm' / 'render.py')!r}, run_name='__main__')\n",
    )
    assert r.returncode == 0, r.stderr
    manual = run / "slurm" / "manual"
    assert mode(run / "slurm") == 0o700 and mode(manual) == 0o700
    import subprocess

    for script in ("submit.sh", "extract.sbatch", "train.sbatch", "prepare.sbatch"):
        text = (manual / script).read_text()
        env_line = next(ln for ln in text.splitlines() if ln.startswith(". "))
        shown = subprocess.run(
            [
                "bash",
                "-c",
                f'set -u; eb_setup() {{ :; }}; {env_line.replace(". ", "source ", 1)}; printf %s "$EB_RUN_DIR"',
            ],
            capture_output=True,
            text=True,
        )
        assert shown.stdout == str(run), (script, shown.stderr)
    # submitit's batch script (eagle-batch extract): the step's folder argument is one literal word.
    import shlex

    from eagle_batch.config import load_config
    from eagle_batch.launch import make_executor

    cfg = load_config(None, [f"run_dir={two_users.base / 'root-run $(touch x)'}", "model.path=/models/m"])
    ex = make_executor(cfg, cfg.run_dir, executor="slurm", check_fits=False)
    text = ex._make_submission_file_text(ex._submitit_command_str, "x")
    step = next(ln for ln in text.splitlines() if "eagle_batch.launch.submitit_entry" in ln)
    assert shlex.split(step)[-1] == f"{cfg.run_dir}/slurm/%j"
    assert not pwned.exists()
    # A newline in a Slurm field would start another #SBATCH line: refused at load, naming the key.
    bad = two_users.base / "newline.yaml"
    bad.write_text('slurm:\n  partition: "gpu\\n#SBATCH --uid=0"\n')
    bad.chmod(0o644)
    r = two_users.run(
        VICTIM, "-m", "eagle_batch.cli", "extract", str(REPO / "configs" / "demo.yaml"), str(bad), f"run_dir={run}"
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "config key 'slurm.partition' holds a control character ('\\n') in 'gpu\\n#SBATCH --uid=0'" in r.stderr

#!/usr/bin/env python3
"""Fill the sbatch templates in slurm/templates/ from an eagle-batch config, for people who submit by hand.

    python slurm/render.py configs/models/kimi-k2.5.yaml configs/clusters/blackwell-8gpu.yaml \
        run_dir=/scratch/$USER/runs/kimi-k25-v1 [key=value ...] [--out DIR]
    bash /scratch/$USER/runs/kimi-k25-v1/slurm/manual/submit.sh

Config files are merged in order, then `key=value` overrides (eagle_batch.config.load_config). Output
(default RUN/slurm/manual/):

    config.yaml        the resolved config every job reads (also saved as RUN/config.yaml, the run's own)
    env.sh             every site value as shell variables; sourced by the job scripts
    lib.sh             shared shell functions (from slurm/templates/lib.sh)
    cache-env.sh       shared compile/download caches (from container/cache-env.sh)
    prepare.sbatch     tokenize + shard plan (CPU)
    extract.sbatch     the extraction array (one task per index; checkpoint signal -> commit -> requeue)
    train.sbatch       aggregate + train (after the array succeeds)
    submit.sh          the driver: prepare (waits), extract array, train with afterok

The container (`slurm.container.runtime`: none | apptainer | pyxis) is wrapped exactly as the submitit
launcher does it (`eagle_batch.launch.submit.container_wrapping`): same binds, same image, same args.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TEMPLATES = HERE / "templates"
CACHE_ENV = REPO / "container" / "cache-env.sh"
JOB_TEMPLATES = ("prepare.sbatch", "extract.sbatch", "train.sbatch")

# The per-task entry point: eagle-batch's own ArrayTask (state files, store lock, resume from the last
# commit), run directly instead of through submitit's pickles.
TASK_PY = "import sys; from eagle_batch.launch.task import ArrayTask; print(ArrayTask(sys.argv[1], int(sys.argv[2]))())"


def _sbatch_extra(lines) -> list[str]:
    """`slurm.additional_sbatch` entries ("--mail-type=END", "#SBATCH --reservation x") as sbatch options."""
    out = []
    for raw in lines:
        line = raw.strip()
        if line.startswith("#SBATCH"):
            line = line[len("#SBATCH") :].strip()
        if not line:
            continue
        out.append(line if line.startswith("-") else "--" + line)
    return out


def sbatch_header(cfg, kind: str, out_dir: Path) -> list[str]:
    sc = cfg.slurm
    name = Path(cfg.run_dir).name
    opts = [f"--job-name=eb-{kind}-{name}"]
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(sc, key):
            opts.append(f"--{key}={getattr(sc, key)}")
    if kind == "prepare":
        # Tokenization only: no GPUs, a few cores, not exclusive.
        opts += [
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={min(sc.cpus_per_task, 8)}",
            "--time=60",
            f"--output={out_dir}/prepare-%j.out",
        ]
    else:
        opts += [
            f"--nodes={sc.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={sc.cpus_per_task}",
            f"--time={sc.time_min}",
        ]
        if sc.gpus_per_node > 0:
            opts.append(f"--gpus-per-node={sc.gpus_per_node}")
        if sc.mem_gb > 0:
            opts.append(f"--mem={sc.mem_gb}G")
        if sc.exclusive:
            opts.append("--exclusive")
        if kind == "extract":
            # submitit's layout, so `eagle-batch status` finds the logs (submit.sh creates the folders).
            log = f"{cfg.run_dir}/slurm/%A_%a/%A_%a_0_log"
            # append: a requeued attempt adds to the log instead of truncating the previous one's.
            opts += [
                "--requeue",
                f"--signal=B:USR2@{sc.signal_delay_s}",
                f"--output={log}.out",
                f"--error={log}.err",
                "--open-mode=append",
            ]
        else:
            opts.append(f"--output={out_dir}/train-%j.out")
    opts += _sbatch_extra(sc.additional_sbatch)
    # Keep the first of a repeated option (--requeue given twice is harmless, but say each once).
    seen, lines = set(), []
    for o in opts:
        if o not in seen:
            seen.add(o)
            lines.append(f"#SBATCH {o}")
    return lines


def _bash_word(item) -> str:
    q = shlex.quote(str(item))
    # shlex leaves commas bare; quoted, a comma-separated mount list does not read like a mistyped
    # array (shellcheck SC2054).
    return f"'{item}'" if "," in q and not q.startswith("'") else q


def _bash_array(name: str, items) -> str:
    return f"{name}=(" + " ".join(_bash_word(i) for i in items) + ")"


def env_sh(cfg, out_dir: Path) -> str:
    from eagle_batch.launch.submit import container_wrapping

    run_dir = Path(cfg.run_dir)
    python, srun_args = container_wrapping(cfg, run_dir)
    python_argv = shlex.split(python) if python else ["python3"]
    q = shlex.quote
    setup = "\n".join(f"    {line}" for line in cfg.slurm.setup) or "    :"
    return f"""# shellcheck shell=bash
# Written by slurm/render.py from {q(str(out_dir / "config.yaml"))}; re-render rather than edit.
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file
EB_RUN_DIR={q(str(run_dir))}
EB_OUT_DIR={q(str(out_dir))}
EB_CONFIG={q(str(out_dir / "config.yaml"))}
EB_CONTAINER_RUNTIME={q(cfg.slurm.container.runtime)}
{_bash_array("EB_PYTHON", python_argv)}
{_bash_array("EB_SRUN_ARGS", srun_args)}
EB_MAX_ATTEMPTS={int(cfg.slurm.max_attempts)}
EB_MAX_NUM_TIMEOUT={int(cfg.slurm.max_num_timeout)}
EB_ARRAY_PARALLELISM={int(cfg.slurm.array_parallelism)}
EB_TASK_PY={q(TASK_PY)}
# Inside a job already: train here (--local), one DDP rank per GPU of this node.
{_bash_array("EB_TRAIN_ARGS", [str(out_dir / "config.yaml"), "--local", "--nproc", max(1, cfg.slurm.gpus_per_node)])}

# slurm.setup lines, then the shared caches (EAGLE_BATCH_CACHE may be set by the setup lines).
eb_setup() {{
{setup}
    # shellcheck source=/dev/null
    . {q(str(out_dir / "cache-env.sh"))}
}}

# shellcheck source=/dev/null
. {q(str(out_dir / "lib.sh"))}
"""


def render(cfg, out_dir: Path) -> list[Path]:
    from eagle_batch.launch.state import slurm_dir
    from eagle_batch.ownership import private_dir

    # The scripts are code the jobs run as you: owner-only, like RUN/slurm (eagle_batch.ownership).
    if out_dir.parent == Path(cfg.run_dir) / "slurm":
        slurm_dir(cfg.run_dir)
    private_dir(out_dir, "the rendered batch scripts")
    env_file = out_dir / "env.sh"
    written = []
    env_file.write_text(env_sh(cfg, out_dir))
    written.append(env_file)
    for name, src in (("lib.sh", TEMPLATES / "lib.sh"), ("cache-env.sh", CACHE_ENV)):
        shutil.copyfile(src, out_dir / name)
        written.append(out_dir / name)
    for name in JOB_TEMPLATES + ("submit.sh",):
        # One shell word whatever the path holds (spaces, `$(...)`): sourced as a literal path.
        text = (TEMPLATES / name).read_text().replace("@ENV_FILE@", shlex.quote(str(env_file)))
        lines = []
        for line in text.splitlines():
            if line.startswith("#EB_SBATCH "):
                lines += sbatch_header(cfg, line.split()[1], out_dir)
            else:
                lines.append(line)
        dest = out_dir / name
        dest.write_text("\n".join(lines) + "\n")
        dest.chmod(0o755)
        written.append(dest)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "configs",
        nargs="+",
        metavar="CONFIG.yaml | key=value",
        help="config files (merged in order) and key=value overrides",
    )
    p.add_argument("--out", default="", help="output folder (default RUN/slurm/manual)")
    p.add_argument("--force", action="store_true", help="reuse a run_dir whose config.yaml has a different data config")
    args = p.parse_args(argv)

    sys.path.insert(0, str(REPO))  # running from a checkout without `pip install -e .`
    from eagle_batch.config import ConfigError, load_config, save_config
    from eagle_batch.config.validate import check_values, claim_run_dir

    files = [a for a in args.configs if "=" not in a]
    overrides = [a for a in args.configs if "=" in a]
    try:
        cfg = load_config(files, overrides)
        check_values(cfg)
        # Jobs start in other folders (and maybe other mount namespaces): make every path absolute, as
        # seen from where render.py runs.
        cfg.run_dir = os.path.abspath(cfg.run_dir)
        cfg.data.inputs = [os.path.abspath(p) for p in cfg.data.inputs]
        for key in ("path", "tokenizer", "chat_template"):
            if getattr(cfg.model, key):
                setattr(cfg.model, key, os.path.abspath(getattr(cfg.model, key)))
        if cfg.train.output_dir:
            cfg.train.output_dir = os.path.abspath(cfg.train.output_dir)
        claim_run_dir(cfg, force=args.force)
    except ConfigError as e:
        print(f"render.py: configuration error: {e}", file=sys.stderr)
        return 2
    out_dir = Path(args.out).resolve() if args.out else Path(cfg.run_dir) / "slurm" / "manual"
    # The run's own config (tasks read it through load_run_config) and the copy the jobs are given.
    save_config(cfg, cfg.run_dir)
    save_config(cfg, out_dir)
    for path in render(cfg, out_dir):
        print(path)
    print(f"submit with: bash {out_dir / 'submit.sh'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

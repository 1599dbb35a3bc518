"""Every `eagle-batch` command README.md shows is a real command, and the README's commands run.

- README drift: each `eagle-batch ...` line of README's code blocks (continuation lines joined) and each
  row of its "CLI reference" table names a command registered in `eagle_batch/cli/__init__.py:COMMANDS` (and a
  benchmark of `eagle_batch/bench/cli.py:BENCHES`), uses only options that command's parser defines, and
  the code-block command lines parse with the real parsers. The table lists every registered command.
- "Running on a cluster": the walk-through block itself (prepare, extract, status, resume, aggregate,
  verify, train) is read from README and run through the real CLI (`eagle_batch.cli.main`, in-process)
  with the README's config files and arguments; only what cannot exist here is replaced by appended
  `key=value` overrides (listed with their reasons in `TINY_RUN`), on a tiny local Llama with the
  SmolLM2 tokenizer and chat template (the fault suite's `faultlib.tiny_llama()`), the `hf` capture
  backend on the CPU and submitit's local executor.
- The benchmarks of the table: `bench store|prepare|loader --json` through the CLI at tiny sizes;
  `bench slurm` on a live Slurm (`@pytest.mark.slurm`). `bench capture` needs vLLM and is run by
  tests/capture/test_bench_scripts.py::test_bench_capture_cpu_tiny (not duplicated here).

Commands of the table run elsewhere: `validate` in tests/capture/test_validate_cli.py, `cancel` in
tests/slurm/test_slurm.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
sys.path.insert(0, str(REPO / "tests" / "faults"))

import faultlib as F  # noqa: E402  (tiny_llama(): the fault suite's local model; DATA: the demo chats)

from eagle_batch.cli import COMMANDS  # noqa: E402
from eagle_batch.cli.bench import BENCHES  # noqa: E402


# ------------------------------------------------------------------------------------ README parsing
def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)


def block_commands(block: str) -> list[list[str]]:
    """argv (after `eagle-batch`) of every eagle-batch command in a code block, continuations joined."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;", line):
            words = shlex.split(part, comments=True)
            for i, w in enumerate(words):
                if Path(w).name == "eagle-batch":  # also `.venv/bin/eagle-batch`
                    out.append(words[i + 1 :])
                    break
    return out


def table_commands(text: str) -> list[str]:
    """The `eagle-batch ...` cell of each row of the CLI reference table, `{a,b}` expanded."""
    section = text.split("## CLI reference", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\|\s*`eagle-batch ([^`]+)`", section, re.M)
    out = []
    for cell in cells:
        m = re.search(r"\{([^}]+)\}", cell)
        out += [cell[: m.start()] + alt + cell[m.end() :] for alt in m.group(1).split(",")] if m else [cell]
    return out


def readme_commands() -> list[tuple[str, list[str] | str]]:
    """[(where, argv list for code blocks | command string for table rows)]."""
    text = README.read_text()
    found: list[tuple[str, list[str] | str]] = [("code", argv) for b in code_blocks(text) for argv in block_commands(b)]
    found += [("table", cell) for cell in table_commands(text)]
    return found


def cluster_block() -> list[list[str]]:
    """The commands of the code block under "Running on a cluster", in README order."""
    section = README.read_text().split("## Running on a cluster", 1)[1].split("\n## ", 1)[0]
    (block,) = code_blocks(section)
    return block_commands(block)


def parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The real parser of `eagle-batch argv[0] ...` (as eagle_batch/cli builds it) and the argv it parses;
    for `bench NAME`, the benchmark's own parser (as eagle_batch/bench/cli.py builds it) and NAME's args."""
    cmd = argv[0]
    assert cmd in COMMANDS, f"README shows `eagle-batch {cmd}`, which is not a command of eagle_batch/cli"
    if cmd == "bench":
        name = argv[1]
        assert name in BENCHES, f"README shows `eagle-batch bench {name}`, not one of {sorted(BENCHES)}"
        p = argparse.ArgumentParser(prog=f"eagle-batch bench {name}")
        p.add_argument("--json", action="store_true")
        importlib.import_module(f"eagle_batch.bench.{name}").add_arguments(p)
        return p, argv[2:]
    p = argparse.ArgumentParser(prog=f"eagle-batch {cmd}")
    importlib.import_module(COMMANDS[cmd][0]).add_arguments(p)
    return p, argv[1:]


def test_readme_commands_are_registered_cli_commands():
    found = readme_commands()
    code = [argv for where, argv in found if where == "code"]
    table = [cell for where, cell in found if where == "table"]
    assert len(code) >= 8 and len(table) >= len(COMMANDS), found  # the parser still finds README's commands
    for argv in code:
        p, rest = parser_for(argv)
        try:
            p.parse_args(rest)
        except SystemExit:
            pytest.fail(f"README's `eagle-batch {' '.join(argv)}` does not parse with its command's parser")
    for cell in table:
        words = cell.split()
        p, _ = parser_for(words)
        known = {s for a in p._actions for s in a.option_strings}
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", cell):
            assert flag in known, f"README's `eagle-batch {cell}`: {flag} is not an option of that command"
    # ... and the table documents every registered command and benchmark.
    assert {c.split()[0] for c in table} == set(COMMANDS)
    assert {c.split()[1] for c in table if c.startswith("bench ")} == set(BENCHES)


# ------------------------------------------------------------------------------ the cluster walk-through
def tiny_run(run: Path, model: Path) -> dict[str, list[str]]:
    """Overrides appended to README's commands; each replaces what cannot exist on a CPU-only test machine."""
    return {
        # appended to every CONFIG command (prepare, extract, train); the same for all, so that prepare and
        # extract agree on the data-config hash (extract refuses a run_dir holding another run).
        "config": [
            f"run_dir={run}",  # README: /scratch/$USER/kimi-run
            f"model.path={model}",  # README: /models/moonshotai/Kimi-K2.5 (600 GB); a tiny Llama with a tokenizer
            "model.tensor_parallel_size=1",  # README: TP=8 over 8 GPUs; one CPU process here
            "model.layer_ids=null",  # README: [2, 30, 58, 61] of 61 layers; the tiny model has 6 (default rule)
            "model.dtype=float32",  # README: bfloat16; bf16 matmuls are slow on the CPU (the fault suite's choice)
            # README: 4097 of Kimi's 262k positions; the tiny model has 4096
            "model.max_model_len=4096",
            "data.max_length=4095",
            "extract.backend=hf",  # README: native = vLLM on GPUs; transformers on the CPU (as tests/faults)
            "slurm.executor=local",  # README's cluster file: slurm; submitit's local executor here
            "slurm.gpus_per_node=0",  # README: 8 GPUs per node; none here
            # training at toy size on the CPU: README's defaults (bf16, 32k draft vocab, full-vocab accuracy,
            # 4 loader workers, 1000 steps) take many minutes on 2 cores
            "train.steps=2",
            "train.batch_tokens=512",
            "train.num_workers=0",
            "train.draft_vocab_size=256",
            "train.accuracy_vs=draft",
            "train.precision=fp32",
        ],
        # appended where README passes these keys
        "data.inputs": [
            f"data.inputs=[{F.DATA}]",  # README: /data/chat/*.jsonl; the repo's demo chats ...
            "data.limit=8",
        ],  # ... 8 of them
        "extract.num_tasks": ["extract.num_tasks=2"],  # README: 64 tasks; 2 here
    }


def localize(argv: list[str], readme_run: str, run: Path, overrides: dict[str, list[str]]) -> list[str]:
    out = [str(run) if a == readme_run else a for a in argv]
    if out[1].endswith((".yaml", ".yml")):  # a CONFIG command: README's own config files are used as they are
        for a in argv:
            key = a.split("=", 1)[0]
            if key in overrides and key != "config":
                out += overrides[key]
        out += overrides["config"]
    if out[0] == "extract":
        out += ["--wait", "--interval", "1"]  # follow the array to the end so aggregate sees complete stores
    if out[0] == "evaluate" and "--prompts" in out:
        # README: a held-out JSONL of the user's chats; here demo chats the run did not train on (data.limit=8
        # took the first 8), two of them, short answers (vLLM on 2 CPU cores)
        i = out.index("--prompts")
        held_out = run.parent / "held-out.jsonl"
        held_out.write_text("".join(F.DATA.read_text().splitlines(keepends=True)[8:10]))
        out[i + 1] = str(held_out)
        out += ["--max-tokens", "16"]
    if out[0] == "train" and "--after" in out:
        # README: `--after RUN` submits a Slurm job with afterok on the extraction array; without Slurm the
        # same training runs here with --local (the run is complete at this point).
        i = out.index("--after")
        del out[i : i + 2]
        out.append("--local")
    return out


def cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = F.cli(*argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_readme_cluster_walkthrough_runs(tmp_path, capsys):
    steps = cluster_block()
    assert [s[0] for s in steps] == [
        "prepare",
        "extract",
        "status",
        "resume",
        "aggregate",
        "verify",
        "train",
        "evaluate",
    ]
    assert all(
        s[1:3] == ["configs/models/kimi-k2.5.yaml", "configs/clusters/blackwell-8gpu.yaml"]
        for s in steps
        if s[0] in ("prepare", "extract", "train")
    )
    readme_run = next(a.split("=", 1)[1] for a in steps[0] if a.startswith("run_dir="))
    run = tmp_path / "kimi-run"
    overrides = tiny_run(run, F.tiny_llama())
    out: dict[str, str] = {}
    for argv in steps:
        argv = localize(argv, readme_run, run, overrides)
        rc, text, err = cli(capsys, argv)
        out[argv[0]] = text
        assert rc == 0, f"eagle-batch {' '.join(argv)} exited {rc}:\n{text[-2000:]}\n{err[-4000:]}"

    plan = json.loads((run / "prepared" / "plan.json").read_text())
    assert plan["num_tasks"] == 2 and sum(t["num_samples"] for t in plan["tasks"]) == 8
    assert "2/2 tasks done" in out["status"], out["status"]
    rc, text, _ = cli(capsys, ["status", str(run), "--json"])
    st = json.loads(text)
    assert rc == 0 and st["totals"]["all_done"] and st["totals"]["samples_committed"] == 8
    assert [t["state"] for t in st["tasks"]] == ["done", "done"]
    assert "nothing to resume" in out["resume"], out["resume"]
    index = json.loads((run / "dataset.json").read_text())
    assert len(index["stores"]) == 2 and index["num_samples"] == 8 and not index["incomplete"]
    assert "OK: 2 store(s), 8 samples verified" in out["verify"], out["verify"]
    export = run / "train" / "kimi-k2.5-eagle3" / "export"  # train.name from configs/models/kimi-k2.5.yaml
    assert (export / "model.safetensors").stat().st_size > 0
    assert json.loads((export / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert "mean acceptance length" in out["evaluate"] and "identical greedy outputs: yes (2/2" in out["evaluate"]


# ------------------------------------------------------------------------------------------- benchmarks
def bench(capsys, *argv: str) -> dict:
    rc, text, err = cli(capsys, ["bench", *argv, "--json"])
    assert rc == 0, err[-4000:]
    return json.loads(text.strip().splitlines()[-1])


def test_bench_store_prepare_loader(tmp_path, capsys):
    # store: real SmolLM2 states (64-row pool, the minimum; cached under $EAGLE_BATCH_CACHE/bench), one
    # 64-token sample of 7168-wide rows written, committed and read back
    r = bench(
        capsys,
        "store",
        "--raw-mb",
        "4",
        "--sample-tokens",
        "64",
        "--pool-rows",
        "64",
        "--reads",
        "5",
        "--dir",
        str(tmp_path / "store"),
    )
    assert r["bench"] == "store" and r["samples"] >= 1 and r["row_shape"] == [4, 7168]
    assert r["ratio"] > 1.0 and r["write_mb_s"] > 0 and r["read_samples_s"] > 0 and r["read_mb_s"] > 0
    r = bench(capsys, "prepare", "--rows", "200", "--workers", "1", "--num-tasks", "4")
    assert r["bench"] == "prepare" and r["rows"] == 200 and r["samples"] > 0
    assert r["rows_per_s"] > 0 and r["tokens_per_s"] > r["rows_per_s"]
    r = bench(
        capsys,
        "loader",
        "--samples",
        "8",
        "--hidden",
        "64",
        "--num-layers",
        "8",
        "--workers",
        "0",
        "--mean-tokens",
        "64",
        "--batch-tokens",
        "256",
        "--dir",
        str(tmp_path / "loader"),
    )
    assert r["bench"] == "loader" and r["store"]["samples"] == 8
    # One measurement with chunk checksums on and one with them off per repeat, side by side, and their ratio.
    assert {m["checksums"] for m in r["loader"]} == {True, False}
    for m in r["loader"]:
        assert m["workers"] == 0 and m["samples"] == 8 and m["samples_s"] > 0 and m["mb_s"] > 0
    assert r["checksum_ratio"]["0"]["estimated_ratio"] > 0


@pytest.mark.slurm
def test_bench_slurm(tmp_path, capsys):
    from eagle_batch.launch.slurm_query import controller_answers

    if not controller_answers():
        pytest.skip("sbatch is installed but no slurmctld answers `scontrol ping` (start one with .ci/slurm-up.sh)")
    r = bench(
        capsys,
        "slurm",
        "--tasks",
        "2",
        "--parallelism",
        "2",
        "--timeout",
        "300",
        "--folder",
        str(tmp_path / "submitit"),
    )
    assert r["bench"] == "slurm" and r["tasks"] == 2 and r["array_job"]
    assert r["submit_s"] > 0 and r["wall_s"] >= r["submit_s"]

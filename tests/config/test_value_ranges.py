"""Bad values of the right type, bad config files and bad overrides: each is one ConfigError (exit 2, one
line, no traceback) naming the key or file and what to do, raised before anything is prepared, trained or
submitted. The value tables are eagle_batch/config/validate.py's ENUMS and RANGES."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest

from eagle_batch.cli import main
from eagle_batch.config import ConfigError, check_values, claim_run_dir, load_config, save_config
from eagle_batch.config.schema import RunConfig
from eagle_batch.config.validate import ENUMS, RANGES

REPO = Path(__file__).resolve().parents[2]
BASE = ["run_dir=/r", "model.path=/m"]


def cfg_with(*overrides: str) -> RunConfig:
    return load_config(None, [*BASE, *overrides])


def config_file(tmp_path: Path, **sections) -> Path:
    """A run's YAML (JSON is YAML): run_dir under tmp_path, the local executor, no GPU, plus `sections`."""
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(tmp_path / "model")},
        "slurm": {"executor": "local", "gpus_per_node": 0},
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    p = tmp_path / "run.yaml"
    p.write_text(json.dumps(cfg))
    return p


def cli_error(capsys, argv: list[str]) -> str:
    """Run the CLI expecting a configuration error; its one stderr line."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "configuration error" in lines[0], err
    return lines[0]


# --- the tables cover the schema ------------------------------------------------------------------------


def _numeric_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            keys += _numeric_keys(kind, f"{prefix}{f.name}.")
        elif kind in (int, float):
            keys.append(f"{prefix}{f.name}")
    return keys


def test_every_numeric_key_of_the_schema_has_a_range():
    numeric = set(_numeric_keys(RunConfig))
    assert numeric - set(RANGES) == set(), "add a Range to RANGES in eagle_batch/config/validate.py"
    assert set(RANGES) - numeric == set(), "RANGES names a key the schema does not have"
    assert {"train.ttt_attention", "train.lm_head_init", "train.accuracy_vs", "extract.engine_process"} <= set(ENUMS)


def test_the_schema_defaults_and_the_shipped_configs_pass():
    check_values(cfg_with())
    for name in ("configs/demo.yaml", "configs/models/kimi-k2.5.yaml", "configs/clusters/blackwell-8gpu.yaml"):
        check_values(load_config(name, BASE))


# --- ranges -----------------------------------------------------------------------------------------------

BAD_VALUES = [
    ("store.level=10", r"store\.level=10 must be in \[0, 9\] \(c-blosc's clevel"),
    ("store.level=-1", r"store\.level=-1 must be in \[0, 9\]"),
    ("store.blocksize=-1", r"store\.blocksize=-1 must be >= 0 \(bytes; 0 lets c-blosc choose\)"),
    ("store.encode_threads=-2", r"store\.encode_threads=-2 must be >= 0"),
    ("extract.batch_samples=0", r"extract\.batch_samples=0 must be >= 1\."),
    ("extract.commit_interval_s=-1", r"extract\.commit_interval_s=-1\.0 must be >= 0 \(0 commits after every batch\)"),
    ("extract.shm_bytes=-1", r"extract\.shm_bytes=-1 must be >= 0 \(0 = min\(8 GiB"),
    ("extract.validate_min_cosine=1.5", r"extract\.validate_min_cosine=1\.5 must be in \[-1, 1\]"),
    ("slurm.time_min=0", r"slurm\.time_min=0 must be >= 1 \(minutes\)"),
    ("slurm.array_parallelism=0", r"slurm\.array_parallelism=0 must be >= 1"),
    ("slurm.cpus_per_task=0", r"slurm\.cpus_per_task=0 must be >= 1"),
    ("slurm.nodes=0", r"slurm\.nodes=0 must be >= 1"),
    ("slurm.mem_gb=-4", r"slurm\.mem_gb=-4 must be >= 0 \(0 = do not ask\)"),
    ("slurm.signal_delay_s=-1", r"slurm\.signal_delay_s=-1 must be >= 0"),
    ("slurm.max_num_timeout=-1", r"slurm\.max_num_timeout=-1 must be >= 0"),
    ("data.limit=-1", r"data\.limit=-1 must be >= 0 \(0 reads every row\)"),
    ("regenerate.temperature=-0.5", r"regenerate\.temperature=-0\.5 must be in \[0, 2\] \(vLLM's range; 0 = greedy\)"),
    ("regenerate.top_p=0", r"regenerate\.top_p=0\.0 must be in \(0, 1\]"),
    ("regenerate.top_p=1.5", r"regenerate\.top_p=1\.5 must be in \(0, 1\]"),
    ("regenerate.top_k=-2", r"regenerate\.top_k=-2 must be >= -1 \(-1 or 0 = no top-k limit\)"),
    ("regenerate.gpu_memory_utilization=0", r"regenerate\.gpu_memory_utilization=0\.0 must be in \(0, 1\]"),
    ("regenerate.seed=-1", r"regenerate\.seed=-1 must be in \[0, 4294967295\]"),
    ("train.steps=-1", r"train\.steps=-1 must be >= 0 \(0 trains nothing and exports the initial draft"),
    ("train.epochs=-1", r"train\.epochs=-1 must be >= 0"),
    ("train.lr=0", r"train\.lr=0\.0 must be > 0\."),
    ("train.lr=nan", r"train\.lr=nan must be > 0"),
    ("train.lr=inf", r"train\.lr=inf must be > 0"),
    ("train.min_lr_ratio=1.5", r"train\.min_lr_ratio=1\.5 must be in \[0, 1\]"),
    ("train.warmup_steps=-1", r"train\.warmup_steps=-1 must be >= 0"),
    ("train.weight_decay=-0.1", r"train\.weight_decay=-0\.1 must be >= 0"),
    ("train.batch_tokens=0", r"train\.batch_tokens=0 must be >= 1"),
    ("train.max_length=0", r"train\.max_length=0 must be >= 1"),
    ("train.ttt_steps=0", r"train\.ttt_steps=0 must be >= 1"),
    ("train.ttt_decay=0", r"train\.ttt_decay=0\.0 must be > 0"),
    ("train.grad_clip=-1", r"train\.grad_clip=-1\.0 must be >= 0 \(0 = no clipping\)"),
    ("train.draft_vocab_size=0", r"train\.draft_vocab_size=0 must be >= 1"),
    ("train.num_workers=-1", r"train\.num_workers=-1 must be >= 0"),
    ("train.prefetch_factor=0", r"train\.prefetch_factor=0 must be >= 1"),
    ("train.checkpoint_every=0", r"train\.checkpoint_every=0 must be >= 1"),
    ("train.log_every=0", r"train\.log_every=0 must be >= 1"),
    ("train.time_budget_s=-1", r"train\.time_budget_s=-1\.0 must be >= 0 \(0 = off\)"),
    ("train.max_time_s=-1", r"train\.max_time_s=-1\.0 must be >= 0 \(0 = off\)"),
    ("train.seed=-1", r"train\.seed=-1 must be in \[0, 4294967295\]"),
    ("train.draft_intermediate_size=-1", r"train\.draft_intermediate_size=-1 must be >= 0 \(0 = the target's\)"),
    ("train.draft_num_heads=-1", r"train\.draft_num_heads=-1 must be >= 0"),
    ("train.draft_num_kv_heads=-1", r"train\.draft_num_kv_heads=-1 must be >= 0"),
]


@pytest.mark.parametrize("override,message", BAD_VALUES, ids=[o for o, _ in BAD_VALUES])
def test_a_value_out_of_range_names_the_key_and_the_range(override, message):
    with pytest.raises(ConfigError, match=message):
        check_values(cfg_with(override))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["store.codec=zstd", "store.level=23"], r"store\.level=23 must be in \[-131072, 22\] \(zstd's levels"),
        (
            ["slurm.time_min=30", "slurm.signal_delay_s=1800"],
            r"slurm\.signal_delay_s=1800 must be below the time limit",
        ),
        (["train.steps=0", "train.time_budget_s=60"], r"train\.time_budget_s=60 never applies with train\.steps=0"),
        (["train.draft_num_heads=6", "train.draft_num_kv_heads=4"], r"train\.draft_num_kv_heads=4 must divide"),
    ],
)
def test_values_that_contradict_another_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_values(cfg_with(*overrides))


EDGE_VALUES = [
    ["store.level=0"],
    ["store.level=9"],
    ["store.codec=zstd", "store.level=-5"],
    ["store.codec=zstd", "store.level=22"],
    ["store.codec=none", "store.level=99"],  # no compression: the level means nothing, so anything goes
    ["store.blocksize=0"],
    ["data.limit=0"],
    ["extract.commit_interval_s=0", "extract.shm_bytes=0"],
    ["slurm.mem_gb=0", "slurm.max_num_timeout=0", "slurm.gpus_per_node=0"],
    ["regenerate.top_k=-1"],
    ["regenerate.top_k=0", "regenerate.temperature=0", "regenerate.top_p=1"],
    ["train.steps=0"],
    ["train.steps=0", "train.epochs=2", "train.time_budget_s=60"],
    ["train.min_lr_ratio=0", "train.grad_clip=0", "train.num_workers=0", "train.warmup_steps=0"],
    ["train.min_lr_ratio=1", "train.draft_num_heads=8", "train.draft_num_kv_heads=2"],
]


@pytest.mark.parametrize("overrides", EDGE_VALUES, ids=["+".join(o) for o in EDGE_VALUES])
def test_documented_edge_values_pass(overrides):
    check_values(cfg_with(*overrides))


@pytest.mark.parametrize(
    "override",
    [
        "train.ttt_attention=fast",
        "train.lm_head_init=zeros",
        "train.optimizer=sgd",
        "train.precision=fp16",
        "train.accuracy_vs=half",
        "extract.engine_process=thread",
    ],
)
def test_choices_are_config_errors(override):
    key, value = override.split("=")
    with pytest.raises(ConfigError, match=rf"{key}='{value}' is not one of "):
        check_values(cfg_with(override))


def test_the_trainer_checks_its_section_before_building_anything(tmp_path):
    from eagle_batch.train.trainer import train

    cfg = load_config(None, [f"run_dir={tmp_path}/run", "model.path=/absent", "train.ttt_attention=fast"])
    with pytest.raises(ConfigError, match=r"train\.ttt_attention='fast' is not one of merged, masked"):
        train(cfg)
    assert not (tmp_path / "run").exists()


# --- config files and overrides ---------------------------------------------------------------------------


def test_a_yaml_list_at_the_top_level_names_the_file(tmp_path, capsys):
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    line = cli_error(capsys, ["prepare", str(p)])
    assert f"{p}: its top level must be a mapping of sections (model:, data:, ...)" in line


def test_an_override_that_is_not_yaml_names_the_override(tmp_path, capsys):
    line = cli_error(capsys, ["prepare", str(config_file(tmp_path)), "data.inputs=[a,b"])
    assert "override 'data.inputs=[a,b': its value is not valid YAML (did not find expected ',' or ']')" in line


def test_did_you_mean_ends_the_sentence_once():
    with pytest.raises(ConfigError) as e:
        cfg_with("data.limt=3")
    assert "Did you mean: 'limit'? Check the key's spelling" in str(e.value)
    assert "?." not in str(e.value)


def test_a_missing_required_key_says_how_to_set_it():
    with pytest.raises(ConfigError, match=r"key 'model\.path' is not set; set it in a config file or as an override"):
        load_config(None, ["run_dir=/r"])


def test_a_run_directory_given_as_config_points_at_its_config_yaml(tmp_path, capsys):
    run = tmp_path / "run"
    save_config(cfg_with(f"run_dir={run}"), run)
    line = cli_error(capsys, ["extract", str(run)])
    assert f"{run} is a run directory, not a config file; pass {run / 'config.yaml'}" in line


def test_a_plain_folder_given_as_config_is_called_a_folder(tmp_path, capsys):
    line = cli_error(capsys, ["extract", str(tmp_path)])
    assert f"{tmp_path} is a folder, not a YAML config file" in line
    assert "does not exist" not in line


# --- every command checks before it starts or submits -----------------------------------------------------


def test_train_refuses_a_bad_value_before_loading_data(tmp_path, capsys):
    line = cli_error(capsys, ["train", str(config_file(tmp_path)), "train.lr=0", "--local"])
    assert "train.lr=0.0 must be > 0." in line
    assert not (tmp_path / "run").exists()


def test_train_checks_each_sweep_entry(tmp_path, capsys):
    cfg = config_file(tmp_path, train={"sweep": [{"train.lr": 0.001}, {"train.ttt_steps": 0}]})
    line = cli_error(capsys, ["train", str(cfg), "--dry-run"])
    assert "train.ttt_steps=0 must be >= 1." in line


def test_train_steps_zero_says_it_exports_the_untrained_draft(tmp_path, capsys):
    assert main(["train", str(config_file(tmp_path)), "train.steps=0", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["steps"] == 0
    assert "draft: train.steps=0 trains nothing; the initial (untrained) draft is exported" in err


def test_resume_checks_its_overrides_before_resubmitting(tmp_path, capsys):
    run = tmp_path / "run"
    save_config(cfg_with(f"run_dir={run}", "slurm.time_min=30"), run)
    line = cli_error(capsys, ["resume", str(run), "slurm.time_min=0"])
    assert "slurm.time_min=0 must be >= 1 (minutes)." in line
    assert load_config(run / "config.yaml").slurm.time_min == 30  # the bad value was not saved
    line = cli_error(capsys, ["resume", str(run), "slurm.signal_delay_s=3600"])
    assert "slurm.signal_delay_s=3600 must be below the time limit, slurm.time_min=30 (1800 s)" in line


def test_extract_then_train_checks_the_training_before_submitting_the_extraction(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))  # tests.slurm.work, the extraction's work
    run = tmp_path / "run"
    (run / "prepared").mkdir(parents=True)
    (run / "prepared" / "plan.json").write_text(json.dumps({"num_tasks": 1, "tasks": []}))
    cfg = config_file(
        tmp_path,
        extract={"work": "tests.slurm.work:empty_work"},
        train={"sweep": [{"train.lr": -1.0}]},
    )
    line = cli_error(capsys, ["extract", str(cfg), "--then-train"])
    assert "train.lr=-1.0 must be > 0." in line
    assert sorted(p.name for p in run.iterdir()) == ["prepared"]  # no config.yaml, state or job: nothing submitted


def test_extract_refuses_a_bad_slurm_value_before_submitting(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    run = tmp_path / "run"
    (run / "prepared").mkdir(parents=True)
    (run / "prepared" / "plan.json").write_text(json.dumps({"num_tasks": 1, "tasks": []}))
    cfg = config_file(tmp_path, extract={"work": "tests.slurm.work:empty_work"})
    line = cli_error(capsys, ["extract", str(cfg), "slurm.array_parallelism=0"])
    assert "slurm.array_parallelism=0 must be >= 1." in line
    assert sorted(p.name for p in run.iterdir()) == ["prepared"]


def test_regenerate_refuses_a_bad_sampling_value_before_planning(tmp_path, capsys):
    line = cli_error(capsys, ["regenerate", str(config_file(tmp_path)), "regenerate.top_p=0"])
    assert "regenerate.top_p=0.0 must be in (0, 1]." in line
    assert not (tmp_path / "run").exists()


# --- a run directory of another run -----------------------------------------------------------------------


def test_another_run_in_run_dir_is_described_by_the_keys_that_differ(tmp_path):
    run = tmp_path / "run"
    save_config(cfg_with(f"run_dir={run}", "data.limit=40"), run)
    with pytest.raises(ConfigError) as e:
        claim_run_dir(cfg_with(f"run_dir={run}", "data.limit=30"))
    msg = str(e.value)
    assert (
        f"run_dir={run} already holds another run with other data settings (data.limit: 40 in the run, 30 now)" in msg
    )
    assert msg.endswith("choose a new run_dir, or pass --force to reuse it.")
    assert "hash" not in msg


def test_many_differences_are_cut_to_a_few(tmp_path):
    run = tmp_path / "run"
    save_config(cfg_with(f"run_dir={run}"), run)
    ours = cfg_with(
        f"run_dir={run}", "model.path=/other", "data.limit=3", "data.max_length=100", "store.shard_tokens=2048"
    )
    with pytest.raises(
        ConfigError,
        match=r"\(model\.path: '/m' in the run, '/other' now; data\.max_length: 2048 in the run, 100 now; "
        r"data\.limit: 0 in the run, 3 now; and 1 more\)",
    ):
        claim_run_dir(ours)


def test_a_nonsense_value_is_reported_before_a_difference(tmp_path):
    run = tmp_path / "run"
    save_config(cfg_with(f"run_dir={run}", "data.limit=40"), run)
    with pytest.raises(ConfigError, match=r"data\.limit=-1 must be >= 0") as e:
        claim_run_dir(cfg_with(f"run_dir={run}", "data.limit=-1"))
    assert "already holds" not in str(e.value)


def test_an_unreadable_config_yaml_in_run_dir_says_so(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match=r"already holds another run whose config\.yaml cannot be read \(.*list"):
        claim_run_dir(cfg_with(f"run_dir={run}"))

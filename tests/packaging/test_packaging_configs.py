"""Every shipped config loads through eagle_batch.config.load_config and passes the value checks; the
model files say what their comments claim (layer ids = the EAGLE-3 default rule for the model's depth)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle_batch.config import default_layer_ids, load_config
from eagle_batch.config.validate import check_values

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
CLUSTER = CONFIGS / "clusters" / "blackwell-8gpu.yaml"

# Text decoder layers of each model (config.json, or text_config for the Kimi-K2.5 VLM wrapper) and the
# tensor parallelism the file sets. The layer ids in each file must be [2, N//2, N-3, N] for this N.
MODELS = {
    "kimi-k2.5.yaml": (61, 8),
    "deepseek-v3.yaml": (61, 8),
    "llama-3.1-8b.yaml": (32, 1),
    "qwen3-8b.yaml": (36, 1),
    "qwen3-30b-a3b.yaml": (48, 1),
}


def test_every_model_file_is_covered():
    assert sorted(p.name for p in (CONFIGS / "models").glob("*.yaml")) == sorted(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_config_loads_alone_and_with_cluster(name, monkeypatch):
    monkeypatch.setenv("EAGLE_BATCH_RUNS", "/scratch/runs")
    n_layers, tp = MODELS[name]
    cfg = load_config([CONFIGS / "models" / name])
    check_values(cfg)
    assert cfg.model.layer_ids == default_layer_ids(n_layers)
    assert cfg.model.tensor_parallel_size == tp
    assert cfg.run_dir.startswith("/scratch/runs/")
    assert cfg.data.max_length <= cfg.model.max_model_len
    # One array task = one node for TP=8 models, one GPU otherwise.
    assert cfg.slurm.gpus_per_node == tp

    merged = load_config([CONFIGS / "models" / name, CLUSTER], [f"run_dir=/scratch/x/{name}"])
    check_values(merged)
    assert merged.model == cfg.model  # the cluster file touches only the slurm section
    assert merged.slurm.partition == "gpu-b200"
    assert merged.slurm.container.runtime == "apptainer"
    assert merged.slurm.gpus_per_node == tp  # kept from the model file


def test_kimi_k25_specifics():
    cfg = load_config([CONFIGS / "models" / "kimi-k2.5.yaml"])
    # Remote code for the tokenizer only (tiktoken-based tokenization_kimi.py); vLLM runs its own classes.
    assert cfg.model.tokenizer_trust_remote_code is True and cfg.model.engine_trust_remote_code is False
    assert cfg.model.trust_remote_code is False
    assert cfg.model.layer_ids == [2, 30, 58, 61]
    assert cfg.model.chat_template == ""  # the model's own template
    assert cfg.data.chat_template_kwargs == {"thinking": True}
    assert cfg.data.non_prefix_stable == "per_turn"
    assert cfg.extract.extra_engine_args == {"language_model_only": True}


def test_extra_engine_args_are_vllm_engine_args():
    vllm_args = pytest.importorskip("vllm.engine.arg_utils")
    fields = set(vllm_args.EngineArgs.__dataclass_fields__)
    for name in MODELS:
        cfg = load_config([CONFIGS / "models" / name])
        unknown = set(cfg.extract.extra_engine_args) - fields
        assert not unknown, f"{name}: extract.extra_engine_args {unknown} are not vLLM EngineArgs fields"


def test_cluster_file_sets_only_slurm(tmp_path):
    import yaml

    data = yaml.safe_load(CLUSTER.read_text())
    assert set(data) == {"slurm"}
    cfg = load_config([CLUSTER], ["run_dir=/x", "model.path=/m"])
    check_values(cfg)
    assert cfg.slurm.gpus_per_node == 8 and cfg.slurm.exclusive is False  # exclusivity is the model's call
    cache_binds = [b for b in cfg.slurm.container.binds if "cache" in b]
    assert cache_binds, "the shared compile cache must be bound into the container"
    assert any(line.startswith("export EAGLE_BATCH_CACHE=") for line in cfg.slurm.setup)


def test_demo_config_and_data(monkeypatch):
    monkeypatch.chdir(REPO)  # data paths in demo.yaml are relative to the repository root
    monkeypatch.setenv("EAGLE_BATCH_CACHE", "/tmp/eb-cache")
    cfg = load_config([CONFIGS / "demo.yaml"])
    check_values(cfg)
    # Exactly where eagle_batch.models.smollm2.materialize() writes the model (its folder name is
    # versioned: a change there must show up here, not as a missing model at run time).
    from eagle_batch.models import smollm2

    assert cfg.model.path == str(
        smollm2.cache_root() / "models" / f"SmolLM2-135M-Instruct-bfloat16-{smollm2.FORMAT_VERSION}"
    )
    assert cfg.model.path.startswith("/tmp/eb-cache/")
    assert cfg.model.layer_ids is None
    (inp,) = cfg.data.inputs
    assert Path(inp).resolve() == (REPO / "eagle_batch" / "demo_data" / "chat.jsonl").resolve()
    for path, n in ((inp, 300), (CONFIGS / "data" / "demo-chat.jsonl", 20)):  # the demo's chats; the test fixture
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        assert len(rows) == n
        for r in rows:
            roles = [m["role"] for m in r["messages"]]
            assert roles[-1] == "assistant" and "user" in roles
            assert all(m["content"].strip() for m in r["messages"])
        assert len({json.dumps(r["messages"]) for r in rows}) == len(rows)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_the_demo_command_runs_configs_demo_yaml_and_sets_only_locations(tmp_path, monkeypatch):
    """`eagle-batch demo` has no settings of its own: its config is demo.yaml with the locations filled in."""
    from eagle_batch import demo
    from eagle_batch.config import config_dict

    monkeypatch.chdir(REPO)
    shipped = _flat(config_dict(load_config([CONFIGS / "demo.yaml"])))
    ran = _flat(config_dict(demo.demo_config(tmp_path / "run", tmp_path / "model", "local", [])))
    assert shipped.keys() == ran.keys()
    assert {k for k in shipped if shipped[k] != ran[k]} <= {"run_dir", "model.path", "data.inputs", "slurm.executor"}
    assert ran["data.inputs"] == [str(demo.DATA_FILE)] and ran["model.path"] == str(tmp_path / "model")

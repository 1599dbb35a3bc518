"""Config loading and pre-submit validation: every error names the key or file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle_batch.config import (
    ConfigError,
    check_config,
    check_tokenizer,
    claim_run_dir,
    config_hash,
    default_layer_ids,
    load_config,
    load_run_config,
    resolve_layer_ids,
    save_config,
)
from eagle_batch.config.load import RESOLVED_NAME


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def fake_model(tmp_path: Path, layers=6, heads=4, kv=2, vocab=100, weights=True, tokenizer=True) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "num_hidden_layers": layers,
                "hidden_size": 64,
                "num_attention_heads": heads,
                "num_key_value_heads": kv,
                "vocab_size": vocab,
            }
        )
    )
    if weights:
        (d / "model.safetensors").write_bytes(b"x")
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
    return d


def test_yaml_and_overrides_merge(tmp_path):
    p = write(tmp_path, "run_dir: /r\nmodel:\n  path: /m\nextract:\n  num_tasks: 4\n")
    cfg = load_config(p, ["extract.num_tasks=8", "store.level=3"])
    assert (cfg.run_dir, cfg.model.path, cfg.extract.num_tasks, cfg.store.level) == ("/r", "/m", 8, 3)


def test_unknown_key_names_its_path(tmp_path):
    p = write(tmp_path, "run_dir: /r\nmodel:\n  path: /m\nextract:\n  num_taks: 4\n")
    with pytest.raises(ConfigError, match=r"extract\.num_taks"):
        load_config(p)


def test_wrong_type_names_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"extract\.num_tasks"):
        load_config(None, ["run_dir=/r", "model.path=/m", "extract.num_tasks=many"])


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["extract.num_tasks"])


def test_save_and_reload_round_trip(tmp_path):
    cfg = load_config(None, [f"run_dir={tmp_path}", "model.path=/m", "model.layer_ids=[1,2]"])
    save_config(cfg, tmp_path)
    again = load_run_config(tmp_path)
    assert again == cfg and config_hash(again) == config_hash(cfg)


def test_config_hash_survives_a_new_field_at_its_default_and_sees_every_change():
    """A release adding a field (at a default that keeps the old behaviour) must not change the
    fingerprint stored in existing runs' task stores; any value away from its default must."""
    from eagle_batch.config.load import fingerprint

    old = {"store": {"codec": "zstd", "chunk_tokens": 512}, "model": {"path": "/m"}}
    old_defaults = {"store": {"codec": "zstd", "chunk_tokens": 256}, "model": {"path": ""}}
    new = {"store": {**old["store"], "dtype": "bfloat16"}, "model": old["model"]}
    new_defaults = {"store": {**old_defaults["store"], "dtype": "bfloat16"}, "model": old_defaults["model"]}
    assert fingerprint(old, old_defaults) == fingerprint(new, new_defaults)
    assert fingerprint(old, old_defaults) != fingerprint(
        {**new, "store": {**new["store"], "dtype": "fp8"}}, new_defaults
    )

    base = load_config(None, ["run_dir=/r", "model.path=/m"])
    assert config_hash(base) != config_hash(load_config(None, ["run_dir=/r", "model.path=/m", "data.max_length=777"]))
    assert config_hash(base) == config_hash(load_config(None, ["run_dir=/r", "model.path=/m", "slurm.partition=other"]))


def test_default_layer_ids_follow_eagle3_rule():
    assert default_layer_ids(61) == [2, 30, 58, 61]  # Kimi-K2.5 / DeepSeek-V3
    assert default_layer_ids(30) == [2, 15, 27, 30]  # SmolLM2
    assert default_layer_ids(4) == [1, 2, 4]  # tiny: duplicates dropped, ascending (vLLM's layer order)


def test_layer_ids_must_ascend(tmp_path):
    m = fake_model(tmp_path, layers=6)
    cfg = load_config(None, [f"run_dir={tmp_path}/r", f"model.path={m}", "model.layer_ids=[2,1,6]"])
    with pytest.raises(
        ConfigError, match=r"model\.layer_ids=\[2, 1, 6\]: list the ids in ascending order \(\[1, 2, 6\]\)"
    ):
        resolve_layer_ids(cfg.model)


def test_layer_ids_out_of_range(tmp_path):
    m = fake_model(tmp_path, layers=6)
    cfg = load_config(None, [f"run_dir={tmp_path}/r", f"model.path={m}", "model.layer_ids=[2,7]"])
    with pytest.raises(ConfigError, match=r"model\.layer_ids.*outside 0\.\.6"):
        resolve_layer_ids(cfg.model)
    cfg = load_config(None, [f"run_dir={tmp_path}/r", f"model.path={m}", "model.layer_ids=[-1]"])
    with pytest.raises(ConfigError, match="outside"):
        resolve_layer_ids(cfg.model)


def test_tp_must_divide_heads(tmp_path):
    m = fake_model(tmp_path, heads=6, kv=2)
    cfg = load_config(None, [f"run_dir={tmp_path}/r", f"model.path={m}", "model.tensor_parallel_size=4"])
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=4 does not divide.*num_attention_heads=6"):
        check_config(cfg)


@pytest.mark.parametrize("what,match", [("weights", "no weight files"), ("tokenizer", "no tokenizer files")])
def test_missing_model_files(tmp_path, what, match):
    m = fake_model(tmp_path, **{what: False})
    cfg = load_config(None, [f"run_dir={tmp_path}/r", f"model.path={m}"])
    with pytest.raises(ConfigError, match=match):
        check_config(cfg)
    cfg = load_config(None, [f"run_dir={tmp_path}/r", f"model.path={tmp_path}/absent"])
    with pytest.raises(ConfigError, match="not a folder"):
        check_config(cfg)


def test_enum_values_checked(tmp_path):
    m = fake_model(tmp_path)
    cfg = load_config(None, [f"run_dir={tmp_path}/r", f"model.path={m}", "extract.backend=magic"])
    with pytest.raises(ConfigError, match=r"extract\.backend='magic'"):
        check_config(cfg)
    cfg = load_config(None, [f"run_dir={tmp_path}/r", f"model.path={m}", "store.dtype=fp8"])
    with pytest.raises(ConfigError, match=r"store\.dtype='fp8' is not one of bfloat16, float8_e4m3"):
        check_config(cfg)


class _Tok:
    def __init__(self, n, template):
        self.n, self.chat_template = n, template

    def __len__(self):
        return self.n


def test_tokenizer_vocab_and_template(tmp_path):
    m = fake_model(tmp_path, vocab=100)
    cfg = load_config(None, [f"run_dir={tmp_path}/r", f"model.path={m}"])
    info = check_config(cfg)
    with pytest.raises(ConfigError, match="has 500 tokens but the model's vocab_size is 100"):
        check_tokenizer(cfg, _Tok(500, "x"), info)
    with pytest.raises(ConfigError, match="no chat template"):
        check_tokenizer(cfg, _Tok(90, None), info)
    check_tokenizer(cfg, _Tok(90, "{{ messages }}"), info)


def test_run_dir_of_another_run_is_refused(tmp_path):
    run = tmp_path / "r"
    a = load_config(None, [f"run_dir={run}", "model.path=/m1"])
    save_config(a, run)
    claim_run_dir(a)  # same config: fine (resume)
    b = load_config(None, [f"run_dir={run}", "model.path=/m2"])
    with pytest.raises(ConfigError, match="already holds another run.*--force"):
        claim_run_dir(b)
    claim_run_dir(b, force=True)


def test_a_relative_run_dir_is_made_absolute_once_and_kept(tmp_path, monkeypatch):
    """A run prepared from one folder is found from any other: RUN/config.yaml keeps the absolute path."""
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["run_dir=runs/a", "model.path=/m"])
    assert cfg.run_dir == str(tmp_path / "runs" / "a")
    save_config(cfg, cfg.run_dir)
    monkeypatch.chdir("/")
    assert load_config(tmp_path / "runs" / "a" / RESOLVED_NAME).run_dir == str(tmp_path / "runs" / "a")


def test_a_run_s_folder_is_its_run_dir_wherever_it_was_created(tmp_path):
    """A moved run (its config.yaml naming where it was) reads and writes where it is now."""
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / RESOLVED_NAME).write_text(f"run_dir: {tmp_path / 'where-it-was'}\nmodel:\n  path: /m\n")
    assert load_run_config(moved).run_dir == str(moved)


def test_a_value_of_the_wrong_type_is_answered_in_plain_words():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.layer_ids=last"])
    msg = str(e.value)
    assert "model.layer_ids must be a list of layer ids, e.g. model.layer_ids=[2,16,29,32]" in msg, msg
    assert "or null for the EAGLE-3 default" in msg and "AnyNode" not in msg and "ListConfig" not in msg
    with pytest.raises(ConfigError, match=r"override 'extract.num_tasks=many': extract.num_tasks must be an integer\."):
        load_config(None, ["extract.num_tasks=many"])
    with pytest.raises(ConfigError, match=r"data.inputs must be a list of strings"):
        load_config(None, ["data.inputs=3"])

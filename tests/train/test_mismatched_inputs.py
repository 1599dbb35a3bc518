"""`train` on data, a checkpoint or settings that do not fit together: a ConfigError naming the folder, the
values and what to do, before the first step (each was a traceback: a tensor shape inside the loss, a
state_dict that does not load, a ValueError), and a draft_vocab_size above the vocabulary said out loud."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, TINY_LAYERS, tiny_cfg, write_fake_target

from eagle_batch.config import ConfigError
from eagle_batch.train.trainer import train


def _store(run_dir: Path, num_hidden_layers: int = TINY["layers"]) -> Path:
    from helpers import random_samples

    from eagle_batch.config.schema import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    path = run_dir / "stores" / "task-00000.zarr"
    spec = StoreSpec(
        layer_ids=TINY_LAYERS, hidden_size=TINY["hidden"], model_name="tiny", num_hidden_layers=num_hidden_layers
    )
    w = TaskStoreWriter.open(path, spec, StoreConfig(fsync=False))
    for s in random_samples(12, TINY_LAYERS, TINY["hidden"], TINY["vocab"], seed=1):
        w.append(s["sample_id"], s["input_ids"].numpy().astype(np.int32), s["loss_mask"].numpy(), s["hidden_states"])
    w.commit()
    w.finalize()
    w.close()
    return path


def _target_with(tmp_path: Path, **config) -> Path:
    """The fake target with config.json keys changed (another model's shape)."""
    target = write_fake_target(tmp_path / "other-target")
    raw = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**raw, **config}))
    return target


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 128}, "hidden_size 64 in the data, 128 in model.path"),
        ({"num_hidden_layers": 8}, "num_hidden_layers 6 in the data, 8 in model.path"),
    ],
)
def test_data_of_another_model_is_refused_before_training(tmp_path, change, message):
    store = _store(tmp_path / "run")
    cfg = tiny_cfg(tmp_path / "run", _target_with(tmp_path, **change), f"train.data={store}")
    with pytest.raises(ConfigError, match=f"{store} holds hidden states of another model .*{message}"):
        train(cfg)
    assert not (tmp_path / "run" / "train").exists()  # refused before the draft's folder is made


def test_data_without_the_last_layer_or_an_aux_layer_is_a_config_error(tmp_path, fake_target):
    store = _store(tmp_path / "run", num_hidden_layers=0)  # written without N: only the layer check applies
    cfg = tiny_cfg(tmp_path / "run", _target_with(tmp_path, num_hidden_layers=8), f"train.data={store}")
    with pytest.raises(ConfigError, match="not the last layer 8"):
        train(cfg)
    cfg = tiny_cfg(tmp_path / "run", fake_target, f"train.data={store}", "train.aux_layer_ids=[1,2,3]")
    with pytest.raises(ConfigError, match=r"missing \[1\]. Set train.aux_layer_ids to layers the data holds"):
        train(cfg)


def test_resuming_a_draft_of_another_shape_is_refused(tmp_path, fake_target, tiny_dataset):
    cfg = tiny_cfg(tmp_path / "run", fake_target, "train.steps=2")
    assert train(cfg, dataset=tiny_dataset)["status"] == "done"
    cfg = tiny_cfg(tmp_path / "run", fake_target, "train.steps=4", "train.draft_vocab_size=64")
    with pytest.raises(ConfigError, match=r"draft_vocab_size=128 in the checkpoint, 64 now \(train.draft_vocab_size\)"):
        train(cfg, dataset=tiny_dataset)


def test_a_draft_vocab_above_the_vocabulary_is_said(tmp_path, fake_target, tiny_dataset, capsys):
    cfg = tiny_cfg(tmp_path / "run", fake_target, "train.steps=1", "train.draft_vocab_size=100000")
    assert train(cfg, dataset=tiny_dataset)["status"] == "done"
    err = capsys.readouterr().err
    assert f"train.draft_vocab_size=100000 is more than the target's vocabulary ({TINY['vocab']} tokens" in err


def test_the_resume_checkpoint_survives_a_missing_latest_target(tmp_path):
    """checkpoints/latest naming a deleted file: the newest other checkpoint is used; with none left, a
    ConfigError (starting again at step 0 would overwrite the trained draft)."""
    from eagle_batch.train.checkpoint import latest_checkpoint

    d = tmp_path / "checkpoints"
    assert latest_checkpoint(tmp_path) is None
    d.mkdir()
    (d / "step-00000010.pt").write_bytes(b"x")
    (d / "step-00000020.pt").write_bytes(b"x")
    (d / "latest").write_text("step-00000020.pt\n")
    assert latest_checkpoint(tmp_path).name == "step-00000020.pt"
    (d / "latest").write_text("step-00000030.pt\n")  # a crash after latest's rename cannot happen; a hand can
    assert latest_checkpoint(tmp_path).name == "step-00000020.pt"
    for p in d.glob("step-*.pt"):
        p.unlink()
    with pytest.raises(ConfigError, match=r"names step-00000030.pt, which no longer exists.*delete"):
        latest_checkpoint(tmp_path)


AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(
    "cpuinfo, native", [(AVX2_ONLY, False), (AVX512_BF16, True), (ARM_BF16, True), ("model name : x\n", None)]
)
def test_native_bf16_is_read_from_the_cpu_flags(cpuinfo, native):
    from eagle_batch.train.fit import cpu_has_native_bf16

    assert cpu_has_native_bf16(cpuinfo) is native


def test_bf16_on_a_cpu_that_emulates_it_is_said_with_the_fix(tmp_path, fake_target, capsys):
    from eagle_batch.train.fit import note_emulated_bf16

    info = tmp_path / "cpuinfo"
    for text, precision, device, said in [
        (AVX2_ONLY, "bf16", "cpu", True),
        (AVX2_ONLY, "fp32", "cpu", False),
        (AVX2_ONLY, "bf16", "cuda", False),
        (AVX512_BF16, "bf16", "cpu", False),
    ]:
        info.write_text(text)
        note_emulated_bf16(tiny_cfg(tmp_path / "run", fake_target, f"train.precision={precision}"), device, str(info))
        err = capsys.readouterr().err
        assert ("train.precision=fp32" in err) is said, (text, precision, device, err)

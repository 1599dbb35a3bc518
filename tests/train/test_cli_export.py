"""Export layout (what vLLM's eagle3 loader reads) and `eagle-batch train` on a real task store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, TINY_LAYERS, write_fake_target
from safetensors import safe_open

from eagle_batch.train.model import Eagle3Draft, draft_config_from_target, export_draft, target_head

ROOT = Path(__file__).resolve().parents[2]


def test_export_layout_matches_vllm_loader(tmp_path, fake_target):
    cfg = draft_config_from_target(fake_target, TINY_LAYERS[:3], TINY_LAYERS[3], 100)
    m = Eagle3Draft(cfg, target_head(fake_target)["embed"])
    ids = torch.tensor(sorted(np.random.default_rng(0).choice(TINY["vocab"], 100, replace=False).tolist()))
    m.set_vocab_map(ids)
    out = export_draft(m, tmp_path / "export")
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLMEagle3"]
    assert conf["draft_vocab_size"] == 100 and conf["vocab_size"] == TINY["vocab"]
    assert conf["target_hidden_size"] == TINY["hidden"] and conf["num_hidden_layers"] == 1
    assert conf["eagle_aux_hidden_state_layer_ids"] == TINY_LAYERS[:3]
    assert conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == TINY_LAYERS[:3]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        d2t = f.get_tensor("d2t")
        t2d = f.get_tensor("t2d")
        fc = f.get_tensor("fc.weight")
    # llama_eagle3.load_weights: "midlayer." -> "layers.0.", q/k/v and gate/up stacked, d2t ->
    # draft_id_to_target_id, t2d skipped; no embed_tokens so vLLM shares the target's embedding.
    h = TINY["hidden"]
    expected = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
        f"midlayer.{n}.weight"
        for n in (
            "input_layernorm",
            "hidden_norm",
            "post_attention_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    }
    assert names == expected
    assert fc.shape == (h, 3 * h) and fc.dtype == torch.bfloat16
    assert d2t.dtype == torch.int64 and (torch.arange(100) + d2t).tolist() == ids.tolist()  # vLLM: base + d2t
    assert t2d.dtype == torch.bool and t2d.nonzero().flatten().tolist() == ids.tolist()


def _write_store(run_dir: Path, n: int = 30) -> None:
    from helpers import random_samples

    from eagle_batch.config.schema import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    path = run_dir / "stores" / "task-00000.zarr"
    w = TaskStoreWriter.open(
        path, StoreSpec(layer_ids=TINY_LAYERS, hidden_size=TINY["hidden"]), StoreConfig(fsync=False)
    )
    for s in random_samples(n, TINY_LAYERS, TINY["hidden"], TINY["vocab"], seed=1):
        w.append(s["sample_id"], s["input_ids"].numpy().astype(np.int32), s["loss_mask"].numpy(), s["hidden_states"])
    w.commit()
    w.finalize()
    w.close()


def _train_config(tmp_path: Path, train: dict, **sections) -> tuple[Path, Path]:
    """A fake target, one task store of tiny samples, and a train config file over them -> (run_dir, file)."""
    target = write_fake_target(tmp_path / "target")
    run_dir = tmp_path / "run"
    _write_store(run_dir)
    conf = tmp_path / "train.yaml"
    conf.write_text(
        json.dumps(
            {  # JSON is YAML
                "run_dir": str(run_dir),
                "model": {"path": str(target)},
                **sections,
                "train": {
                    "data": f"{run_dir}/stores/task-00000.zarr",
                    "batch_tokens": 256,
                    "draft_vocab_size": 64,
                    "ttt_steps": 2,
                    "precision": "fp32",
                    **train,
                },
            }
        )
    )
    return run_dir, conf


def test_train_cli_local_sweep_on_a_task_store(tmp_path):
    run_dir, conf = _train_config(
        tmp_path,
        {
            "steps": 3,
            "num_workers": 1,
            "prefetch_factor": 2,
            "tensorboard": True,
            "sweep": [{"train.lr": 0.001}, {"train.lr": 0.003, "train.ttt_steps": 3}],
        },
    )
    cmd = [sys.executable, "-m", "eagle_batch.cli", "train", str(conf), "train.log_every=1"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    dry = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert dry.returncode == 0, dry.stderr
    tasks = [json.loads(x) for x in dry.stdout.splitlines()]
    assert [(t["name"], t["lr"], t["ttt_steps"]) for t in tasks] == [("draft-0", 0.001, 2), ("draft-1", 0.003, 3)]
    r = subprocess.run(cmd + ["--local"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for name, k in (("draft-0", 2), ("draft-1", 3)):
        out = run_dir / "train" / name
        assert (out / "export" / "model.safetensors").is_file()
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
        assert len(recs) == 3 and len(recs[-1]["acc_per_step"]) == k
        assert list((out / "tb").glob("events.out.tfevents.*"))


def test_ddp_two_ranks_gloo(tmp_path):
    """Two CPU ranks (gloo): same steps on both, gradients averaged, one export, metrics from rank 0."""
    from conftest import tiny_cfg

    from eagle_batch.launch.local_train import run_local

    target = write_fake_target(tmp_path / "target")
    run_dir = tmp_path / "run"
    _write_store(run_dir, n=40)
    cfg = tiny_cfg(run_dir, target, f"train.data={run_dir}/stores/task-00000.zarr", "train.steps=3")
    r = run_local(cfg, nproc=2)
    assert r["status"] == "done" and r["step"] == 3
    out = run_dir / "train" / "draft"
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["world_size"] == 2
    assert len([x for x in recs if "loss" in x]) == 3
    ck = torch.load(sorted((out / "checkpoints").glob("step-*.pt"))[-1], weights_only=False)
    assert ck["world_size"] == 2 and set(ck["rng"]) == {"0", "1"}


@pytest.mark.slurm
def test_train_submits_a_slurm_array_and_it_trains(tmp_path):
    """`eagle-batch train` without --local: a 2-task array (sweep) on the local Slurm; both export."""
    import time

    run_dir, conf = _train_config(
        tmp_path,
        {"steps": 2, "num_workers": 0, "tensorboard": False, "sweep": [{"train.lr": 0.001}, {"train.lr": 0.002}]},
        slurm={"executor": "slurm", "gpus_per_node": 0, "cpus_per_task": 1, "time_min": 20},
    )
    r = subprocess.run(
        [sys.executable, "-m", "eagle_batch.cli", "train", str(conf)], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0 and "submitted 2 training task(s)" in r.stdout, r.stdout + r.stderr
    deadline = time.time() + 600
    outs = [run_dir / "train" / f"draft-{i}" / "result.json" for i in (0, 1)]
    while time.time() < deadline and not all(p.is_file() for p in outs):
        time.sleep(5)
    assert all(p.is_file() for p in outs), list((run_dir / "slurm").rglob("*.err"))
    assert all(json.loads(p.read_text())["status"] == "done" for p in outs)


def test_export_is_readable_by_others_under_the_usual_umask(tmp_path, fake_target):
    import os
    import stat

    cfg = draft_config_from_target(fake_target, TINY_LAYERS[:3], TINY_LAYERS[3], 100)
    m = Eagle3Draft(cfg, target_head(fake_target)["embed"])
    m.set_vocab_map(torch.arange(100))
    old = os.umask(0o022)
    try:
        out = export_draft(m, tmp_path / "export")
    finally:
        os.umask(old)
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o644  # safetensors alone writes 0600
    assert stat.S_IMODE((out / "config.json").stat().st_mode) == 0o644
    assert stat.S_IMODE(out.stat().st_mode) == 0o755

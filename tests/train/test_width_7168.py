"""Kimi-K2.5's real width (hidden 7168) through the store, the loader and one training step of the draft.

Every other test runs widths of 64-1024; the real target class is 7168 wide (4 captured layers = 56 KiB of
bf16 per token), so the store's chunk layout, the loader's batches, the draft's fc over 3 x 7168 and its
export are checked at that width here. The target is the trainer's view of a Kimi-K2.5 checkpoint: the
wrapper's config.json at the real text width (kimi.REAL_WIDTH, 8 layers) with the weights the trainer reads
(embedding, final norm, lm_head under the checkpoint's `language_model.` names). To fit the CI machine
(2 cores, < 6 GB): a target vocabulary of 1,024 (the real one is 163,840), 128 tokens in 3 samples, a draft
of 4 attention heads, MLP 256, draft vocabulary 64, AdamW (Muon's Newton-Schulz over the 7168 x 21504 fc
would dominate a CPU step), fp32. The draft's fc (21504 -> 7168) is the real one: ~2.5 GB with AdamW.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from conftest import tiny_cfg
from helpers import random_samples

from eagle_batch.models import kimi

WIDTH = 7168
LAYERS = [2, 4, 5, 8]  # the default rule on N = 8 layers
VOCAB = 1024


def _kimi_target(dest: Path) -> Path:
    """config.json of a Kimi-K2.5 wrapper at the real width + the tensors the trainer reads from it."""
    from safetensors.torch import save_file

    dest.mkdir(parents=True)
    text = dict(kimi.REAL_WIDTH, num_hidden_layers=8)
    text.pop("vocab_size")
    cfg = kimi.kimi_config_dict(VOCAB, {"bos": 1, "eos": 2, "pad": 3, "media": 4}, text)
    (dest / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "language_model.model.embed_tokens.weight": (0.02 * torch.randn(VOCAB, WIDTH, generator=g)).bfloat16(),
            "language_model.model.norm.weight": (0.5 + torch.rand(WIDTH, generator=g)).bfloat16(),
            "language_model.lm_head.weight": (0.02 * torch.randn(VOCAB, WIDTH, generator=g)).bfloat16(),
        },
        str(dest / "model.safetensors"),
    )
    return dest


def test_store_loader_and_a_training_step_at_width_7168(tmp_path):
    from eagle_batch.config import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter, open_dataset
    from eagle_batch.store.verify import verify
    from eagle_batch.train.trainer import train

    target = _kimi_target(tmp_path / "kimi")
    run = tmp_path / "run"
    store = run / "stores" / "task-00000.zarr"
    samples = random_samples(3, LAYERS, WIDTH, VOCAB, min_len=24, max_len=64)
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=WIDTH, model_name="kimi-width", num_hidden_layers=8)
    w = TaskStoreWriter.open(store, spec, StoreConfig(fsync=False))
    for s in samples:
        w.append(s["sample_id"], s["input_ids"].numpy().astype(np.int32), s["loss_mask"].numpy(), s["hidden_states"])
    w.commit()
    w.finalize()
    w.close()

    # The store: checked on read, bit-identical bf16, and `verify` finds nothing wrong.
    assert verify(store) == []
    ds = open_dataset(store)
    assert len(ds) == 3 and ds.layer_ids == LAYERS and ds.spec.hidden_size == WIDTH
    for i, s in enumerate(samples):
        got = ds[i]
        assert got["hidden_states"].shape == (len(s["input_ids"]), 4, WIDTH)
        assert torch.equal(got["hidden_states"].view(torch.int16), s["hidden_states"].view(torch.int16))
        assert torch.equal(torch.as_tensor(got["input_ids"]).long(), s["input_ids"])
    tokens = sum(len(s["input_ids"]) for s in samples)
    stored = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    assert stored < tokens * 4 * WIDTH * 2 * 1.1  # compressed or kept raw, never inflated

    # The loader (the trainer's EpochLoader over the store, read from disk) and one optimizer step.
    cfg = tiny_cfg(
        run,
        target,
        "train.steps=1",
        "train.warmup_steps=0",
        "train.batch_tokens=256",
        "train.draft_vocab_size=64",
        "train.draft_num_heads=4",
        "train.draft_num_kv_heads=4",
        "train.draft_intermediate_size=256",
        "train.optimizer=adamw",
        "train.checkpoint_every=100",
    )
    r = train(cfg, dataset=ds)
    assert r["status"] == "done" and r["step"] == 1
    out = run / "train" / "draft"
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(x for x in recs if "loss" in x)
    assert np.isfinite(step["loss"]) and step["grad_norm"] > 0 and step["peak_gpu_memory_gib"] == 0.0

    # The export vLLM serves: an EAGLE-3 draft of hidden 7168 whose fc reads 3 x 7168 target features.
    exported = json.loads((Path(r["export_dir"]) / "config.json").read_text())
    assert exported["hidden_size"] == WIDTH and exported["target_hidden_size"] == WIDTH
    from safetensors import safe_open

    with safe_open(str(Path(r["export_dir"]) / "model.safetensors"), "pt") as f:
        assert tuple(f.get_slice("fc.weight").get_shape()) == (WIDTH, 3 * WIDTH)

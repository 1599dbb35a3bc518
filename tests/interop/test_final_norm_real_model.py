"""The SpecForge export's `hidden_state` (layer N through the final norm, applied by eagle-batch) is the
real model's own post-norm state: SmolLM2-135M's transformers `hidden_states[-1]`, which SGLang hands
SpecForge. Checks the norm's weight lookup, its epsilon and the formula on a real checkpoint."""

from __future__ import annotations

import numpy as np
import torch

from eagle_batch.capture.hf import hf_hidden_states, load_hf_model
from eagle_batch.cli import main
from eagle_batch.config import StoreConfig, model_info
from eagle_batch.store import StoreSpec, TaskStoreWriter


def test_specforge_hidden_state_is_the_models_post_norm_state(tmp_path, smollm2_path):
    n = model_info(smollm2_path).num_hidden_layers
    layers = [2, n // 2, n - 3, n]
    model = load_hf_model(str(smollm2_path), dtype="float32", device="cpu")
    ids = np.random.default_rng(0).integers(0, 49152, 48).tolist()
    with torch.no_grad():
        pre = hf_hidden_states(model, ids, layers).to(torch.bfloat16)  # layer N before the norm (a hook)
        post = model.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]  # after it
    store = tmp_path / "task-00000.zarr"
    spec = StoreSpec(layer_ids=layers, hidden_size=pre.shape[-1], num_hidden_layers=n)
    w = TaskStoreWriter.open(store, spec, StoreConfig(fsync=False))
    w.append("s0", np.array(ids, np.int32), np.ones(len(ids), np.uint8), pre)
    w.commit()
    w.finalize()
    w.close()
    out = tmp_path / "sf"
    rc = main(["export-data", str(store), str(out), "--format", "specforge", "--target", str(smollm2_path)])
    assert rc == 0
    got = torch.load(out / "rows_0-5000" / "data_0.ckpt", weights_only=True)["hidden_state"][0].float()
    cos = torch.nn.functional.cosine_similarity(got, post, dim=-1)
    rel = (got - post).abs().mean() / post.abs().mean()
    assert cos.min() > 0.999 and rel < 0.01, (cos.min(), rel)  # bf16 rounding of the stored state only
    raw = pre[:, -1].float()
    assert (raw - post).abs().mean() / post.abs().mean() > 0.5  # the stored state is far from it: the norm matters

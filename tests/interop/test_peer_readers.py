"""The export read by the peers' own dataset classes (speculators 0.9.0 `ArrowDataset`, SpecForge 0.2.0
`OfflineEagle3Dataset`) gives back the store's tokens, masks and states; speculators' trainer builds its
draft from it (`--dry-run`: vocabulary maps from token_freq.pt, aux layer ids).

The peers pin other torch / transformers versions than eagle-batch, so scripts/setup.sh installs them
without dependencies into .venv-peers/ (with `datasets` and the few of its dependencies .venv lacks); the
reading runs in a subprocess whose path starts there. Skipped only when that folder is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from interop_testlib import EPS, HIDDEN

from eagle_batch.cli import main
from eagle_batch.config import StoreConfig, model_info
from eagle_batch.store import StoreSpec, TaskStoreWriter

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / ".venv-peers"

pytestmark = pytest.mark.skipif(
    not (PEERS / "speculators").is_dir(),
    reason=f"{PEERS} is absent: scripts/setup.sh installs the peer trainers there (speculators, specforge)",
)


def peer_read(fmt: str, out: Path, tmp_path: Path) -> list[dict]:
    dest = tmp_path / f"{fmt}.pt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PEERS), str(ROOT)]), "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("peer_read.py")), fmt, str(out), str(dest)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return torch.load(dest, weights_only=False)


def bf16(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(bits)).view(torch.bfloat16)


def test_speculators_arrow_dataset_reads_the_export(tmp_path, store, samples):
    out = tmp_path / "spec"
    assert main(["export-data", str(store), str(out), "--format", "speculators", "--no-fsync"]) == 0
    items = peer_read("speculators", out, tmp_path)
    assert len(items) == len(samples)
    for x, (sid, ids, mask, hs) in zip(items, samples):
        t = len(ids)
        assert x["sample_id"] == sid and x["approx_len"] == t
        assert x["input_ids"].tolist() == ids.tolist() and x["loss_mask"].tolist() == mask.tolist()
        # The draft's fc input: aux layers 2, 3, 4 side by side; the verifier's last state: layer N, pre-norm.
        assert torch.equal(x["hidden_states"].view(torch.int16), bf16(hs[:, :3]).reshape(t, -1).view(torch.int16))
        assert torch.equal(x["verifier_last_hidden_states"].view(torch.int16), bf16(hs[:, 3]).view(torch.int16))


def test_specforge_offline_dataset_reads_the_export(tmp_path, store, samples, target):
    from eagle_batch.train.target import final_norm_weight

    out = tmp_path / "sf"
    rc = main(["export-data", str(store), str(out), "--format", "specforge", "--target", str(target), "--no-fsync"])
    assert rc == 0
    items = peer_read("specforge", out, tmp_path)
    assert len(items) == len(samples)
    w = final_norm_weight(target).float()
    by_index = {int(Path(x["path"]).stem.split("_")[1]): x for x in items}  # listed by path, not sample order
    for i, (_, ids, mask, hs) in enumerate(samples):
        x, t = by_index[i], len(ids)
        assert x["input_ids"].tolist() == [ids.tolist()]
        # SpecForge zeroes the last position's mask itself (its reader: no next token to predict there).
        assert x["loss_mask"][0, :-1].tolist() == mask[:-1].tolist() and x["loss_mask"][0, -1] == 0
        assert torch.equal(
            x["hidden_state"].view(torch.int16), bf16(hs[:, :3]).reshape(1, t, 3 * HIDDEN).view(torch.int16)
        )
        last = bf16(hs[:, 3]).float()
        normed = (last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + EPS) * w).to(torch.bfloat16)
        assert torch.equal(x["target"][0], normed)  # SpecForge's target: the final state after the norm


def test_speculators_trainer_builds_its_draft_from_the_export(tmp_path, smollm2_path):
    """`speculators train --dry-run` (its CLI, config resolution, vocabulary maps, draft build) on an export
    of SmolLM2-shaped states: the draft vocabulary is the top tokens of token_freq.pt, the aux layer ids the
    export's, and the command line is the one the GPU comparison uses."""
    info = model_info(smollm2_path)
    n = info.num_hidden_layers
    layers = [2, n // 2, n - 3, n]
    g = np.random.default_rng(1)
    samples = []
    for i in range(6):
        t = int(g.integers(20, 60))
        hs = (g.standard_normal((t, 4, info.hidden_size)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        samples.append((f"q{i}", g.integers(0, 300, t).astype(np.int32), (g.random(t) < 0.7).astype(np.uint8), hs))
    store = tmp_path / "task-00000.zarr"
    spec = StoreSpec(layer_ids=layers, hidden_size=info.hidden_size, num_hidden_layers=n)
    w = TaskStoreWriter.open(store, spec, StoreConfig(fsync=False))
    for s in samples:
        w.append(*s)
    w.commit()
    w.finalize()
    w.close()
    out = tmp_path / "spec"
    assert main(["export-data", str(store), str(out), "--format", "speculators", "--no-fsync"]) == 0
    aux = [str(k) for k in layers[:3]]
    cmd = [sys.executable, "-m", "speculators", "train", "--speculator-type", "eagle3", "--dry-run"]
    cmd += ["--verifier-name-or-path", str(smollm2_path), "--data-path", str(out), "--on-missing", "raise"]
    cmd += ["--target-layer-ids", *aux, "--draft-vocab-size", "64", "--save-path", str(tmp_path / "ckpt")]
    env = {**os.environ, "PYTHONPATH": str(PEERS), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    counts = Counter(int(t) for _, ids, mask, _ in samples for t in ids[mask == 1])
    assert len(counts) > 64  # enough distinct targets that speculators pads nothing
    top = sorted(sorted(counts, key=lambda k: (-counts[k], k))[:64])
    d2t = np.load(out / "d2t-64.npy")  # speculators stores target id - draft index
    assert (d2t + np.arange(64)).tolist() == top
    conf = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert conf["eagle_aux_hidden_state_layer_ids"] == layers[:3]

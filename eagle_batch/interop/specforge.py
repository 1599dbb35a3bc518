"""SpecForge's offline EAGLE-3 features (checked against specforge 0.2.0's `OfflineEagle3Dataset`; the file
names and grouping are those of SpecForge's `scripts/prepare_hidden_states.py`, which the wheel does not ship):

    OUT/rows_{g}-{g+5000}/data_{i}.ckpt    torch.save of {"input_ids": int64 [T], "loss_mask": int64 [T],
                                           "hidden_state": bf16 [1, T, H] = the last layer N AFTER the
                                           target's final norm, "aux_hidden_state": bf16 [1, T, n_aux * H]
                                           = the aux layers ascending, concatenated on the last axis}

SpecForge lists every `.ckpt` under OUT (sorted by path, so not in sample order), feeds `aux_hidden_state`
to the draft's fc and `hidden_state` straight to the lm_head (its `TargetHead` has no norm): hence the final
norm applied here, in float32, with the target's weight and `rms_norm_eps`. Its layer ids count the
producing layer's output, one less than eagle-batch's (layers.to_output_convention).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .layers import PeerLayers, to_output_convention

# Samples per rows_* folder, as SpecForge's prepare_hidden_states.py groups them; its reader walks OUT
# recursively, so the grouping only keeps folders small.
GROUP = 5000
NORM_ROWS = 1024  # tokens normalized at once: bounds the float32 copy to NORM_ROWS x H


class SpecForgeFormat:
    name = "specforge"

    def __init__(self, layers: PeerLayers, norm_weight, eps: float):
        self.layers = layers
        self.norm_weight = norm_weight.float()
        self.eps = float(eps)

    def identity(self) -> dict:
        w = self.norm_weight.numpy().astype("<f4").tobytes()
        return {"layer_ids": self.layers.ids, "final_norm_sha256": hashlib.sha256(w).hexdigest(), "eps": self.eps}

    def peer_layer_ids(self) -> dict:
        return {
            "aux_hidden_state_layer_ids": to_output_convention(self.layers.aux_ids),
            "last_layer_id": to_output_convention([self.layers.last_id])[0],
        }

    def sample_path(self, i: int) -> str:
        g = (i // GROUP) * GROUP
        return f"rows_{g}-{g + GROUP}/data_{i}.ckpt"

    def normed_last(self, last_bits: np.ndarray):
        """[T, H] uint16 bits of layer N -> bf16 [T, H] after the final norm."""
        import torch

        from eagle_batch.train.target import rms_norm

        x = torch.from_numpy(np.ascontiguousarray(last_bits)).view(torch.bfloat16)
        out = torch.empty_like(x)
        for a in range(0, x.shape[0], NORM_ROWS):
            out[a : a + NORM_ROWS] = rms_norm(x[a : a + NORM_ROWS], self.norm_weight, self.eps).to(torch.bfloat16)
        return out

    def write_sample(self, path: Path, input_ids: np.ndarray, loss_mask: np.ndarray, hidden_bits: np.ndarray) -> None:
        import torch

        t, n_sel, h = hidden_bits.shape
        aux = np.ascontiguousarray(hidden_bits[:, : n_sel - 1]).reshape(1, t, (n_sel - 1) * h)
        torch.save(
            {
                "input_ids": torch.from_numpy(input_ids.astype(np.int64)),
                "loss_mask": torch.from_numpy(loss_mask.astype(np.int64)),
                "hidden_state": self.normed_last(hidden_bits[:, n_sel - 1]).unsqueeze(0),
                "aux_hidden_state": torch.from_numpy(aux).view(torch.bfloat16),
            },
            str(path),
        )

    def finish(self, out: Path, ds, fingerprint: str, fsync: bool, each) -> dict:
        return {}

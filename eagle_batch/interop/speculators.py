"""speculators' offline training data (checked against speculators 0.9.0 and hs-connectors 0.9.0):

    OUT/                            an HF `datasets` save_to_disk folder, format "torch" (hf_arrow.py):
                                    input_ids list<int64>, loss_mask list<int64>, seq_len int64, and
                                    sample_id string (eagle-batch's id; speculators ignores extra columns)
    OUT/token_freq.pt               torch.save({token_id: count}) over the loss-masked tokens
    OUT/hidden_states/hs_{i}.safetensors   row i of the dataset: "hidden_states" bf16 [T, n_aux + 1, H]
                                    (aux layers ascending, then the last layer N before the final norm) and
                                    "token_ids" int64 [T]

speculators' `ArrowDataset(datapath=OUT)` pairs row i with `hs_{i}` (`FileTransfer.get_cached`), checks
token_ids against the row's input_ids, and feeds `hidden_states[:, :-1]` flattened to the draft's fc and
`hidden_states[:, -1]` through the verifier's norm and lm_head. Layer ids are vLLM's, as eagle-batch's: the
trainer's `--target-layer-ids` are the aux ids unchanged.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from .hf_arrow import HFDatasetWriter
from .layers import PeerLayers

HS_DIR = "hidden_states"
TOKEN_FREQ = "token_freq.pt"
SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int64())),
        ("loss_mask", pa.list_(pa.int64())),
        ("seq_len", pa.int64()),
        ("sample_id", pa.string()),
    ]
)


class SpeculatorsFormat:
    name = "speculators"

    def __init__(self, layers: PeerLayers):
        self.layers = layers

    def identity(self) -> dict:
        return {"layer_ids": self.layers.ids}

    def peer_layer_ids(self) -> dict:
        return {"target_layer_ids": self.layers.aux_ids, "last_layer_id": self.layers.last_id}

    def sample_path(self, i: int) -> str:
        return f"{HS_DIR}/hs_{i}.safetensors"

    def write_sample(self, path: Path, input_ids: np.ndarray, loss_mask: np.ndarray, hidden_bits: np.ndarray) -> None:
        import torch
        from safetensors.torch import save_file

        save_file(
            {
                "hidden_states": torch.from_numpy(np.ascontiguousarray(hidden_bits)).view(torch.bfloat16),
                "token_ids": torch.from_numpy(input_ids.astype(np.int64)),
            },
            str(path),
        )

    def finish(self, out: Path, ds, fingerprint: str, fsync: bool, each) -> dict:
        """The dataset folder and token_freq.pt from a pass over the token arrays only (no hidden states)."""
        import torch

        from eagle_batch.store.durable import partial_name

        w = HFDatasetWriter(out, SCHEMA, "torch")
        freq: Counter[int] = Counter()
        try:
            for i in each(range(len(ds))):
                ids, mask = ds.token_arrays(i)
                ids64 = ids.astype(np.int64)
                freq.update(ids64[mask.astype(bool)].tolist())
                w.add(
                    {
                        "input_ids": ids64,
                        "loss_mask": mask.astype(np.int64),
                        "seq_len": len(ids64),
                        "sample_id": ds.sample_id(i),
                    }
                )
        except BaseException:
            w.abort()
            raise
        rows = w.close(fingerprint, "eagle-batch export for speculators (docs/reference/store-format.md)", fsync=fsync)
        tmp = partial_name(out / TOKEN_FREQ)
        torch.save(dict(sorted(freq.items())), tmp)
        tmp.replace(out / TOKEN_FREQ)
        return {"rows": rows, "token_freq_entries": len(freq)}

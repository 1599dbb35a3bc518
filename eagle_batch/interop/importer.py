"""speculators' offline data folder -> one eagle-batch task store, through the store's own writer.

Row i of the folder's dataset and `hidden_states/hs_{i}.safetensors` become one sample: input_ids and
loss_mask from the row, the states as they are (bf16 `[T, n_aux + 1, H]`: the aux layers, then the last
layer N before the final norm; vLLM's ids, which are eagle-batch's). The files do not say which layers they
hold, so the caller names them. Samples the store already committed are skipped, so a rerun resumes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from eagle_batch.errors import UserError

from .hf_arrow import read_hf_rows
from .speculators import HS_DIR

COMMIT_EVERY = 256  # samples per commit: a killed import redoes at most these


def _load_states(path: Path) -> dict:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise UserError(f"{path} is missing: this row has no hidden states (generate them first)") from None
    except Exception as e:  # safetensors raises its own error type for damaged headers
        raise UserError(f"{path}: not a readable safetensors file ({e}); regenerate it") from None


def import_speculators(
    src: Path,
    store: Path,
    aux_layer_ids: Sequence[int],
    num_hidden_layers: int,
    *,
    model_name: str = "",
    store_cfg=None,
    each: Callable[[Iterable], Iterable] = lambda it: it,
) -> dict:
    """Append every row of `src` not yet in `store` (created if absent), then finalize it."""
    import torch

    from eagle_batch.config import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    aux = [int(k) for k in aux_layer_ids]
    n = int(num_hidden_layers)
    if not aux or aux != sorted(set(aux)) or aux[-1] >= n or aux[0] < 0:
        raise UserError(
            f"--aux-layer-ids {aux}: give the aux layer ids (vLLM's convention) ascending, each below "
            f"--num-hidden-layers {n}"
        )
    first = _load_states(src / HS_DIR / "hs_0.safetensors")["hidden_states"]
    spec = StoreSpec(
        layer_ids=[*aux, n],
        hidden_size=int(first.shape[-1]),
        num_hidden_layers=n,
        model_name=model_name,
        extra={"imported_from": "speculators"},
    )
    writer = TaskStoreWriter.open(store, spec, store_cfg or StoreConfig())
    added = skipped = 0
    try:
        done = writer.committed_sample_ids
        rows = read_hf_rows(src, ["input_ids", "loss_mask"], optional=("sample_id",))
        for i, row in each(enumerate(rows)):
            sid = str(row.get("sample_id") or f"row-{i:08d}")
            if sid in done:
                skipped += 1
                continue
            f = src / HS_DIR / f"hs_{i}.safetensors"
            hs = _load_states(f)
            states, ids = hs.get("hidden_states"), np.asarray(row["input_ids"], dtype=np.int64)
            if states is None or tuple(states.shape[1:]) != (len(aux) + 1, spec.hidden_size):
                raise UserError(
                    f"{f}: hidden_states {None if states is None else tuple(states.shape)} is not "
                    f"[T, {len(aux) + 1}, {spec.hidden_size}] (the {len(aux)} aux layers of --aux-layer-ids "
                    "and the last layer)"
                )
            if "token_ids" in hs and not np.array_equal(hs["token_ids"].numpy().astype(np.int64), ids):
                raise UserError(f"{f}: token_ids differ from row {i}'s input_ids; the folder mixes two datasets")
            writer.append(
                sid,
                ids.astype(np.int32),
                np.asarray(row["loss_mask"], dtype=np.uint8),
                states.to(torch.bfloat16).contiguous(),
            )
            added += 1
            if added % COMMIT_EVERY == 0:
                writer.commit()
        writer.commit()
        writer.finalize()
    finally:
        writer.close()
    return {"store": str(store), "added": added, "skipped": skipped, "layer_ids": spec.layer_ids}

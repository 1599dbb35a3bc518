"""speculators' offline data folder -> one eagle-batch task store, through the store's own writer.

Row i of the folder's dataset and `hidden_states/hs_{i}.safetensors` become one sample: input_ids and
loss_mask from the row, the states as they are (bf16 `[T, n_aux + 1, H]`: the aux layers, then the last
layer N before the final norm; vLLM's ids, which are eagle-batch's). The files do not say which layers they
hold, so the caller names them. Samples the store already committed are skipped, so a rerun resumes.

Everything checkable is checked before the destination store is created: SRC is a speculators folder (its
state.json and hidden_states/), STORE can be a folder, and the first row and its hs_0 agree with the
options (layer count, token ids). So a wrong option leaves nothing behind, and a corrected rerun is not
refused as "written for a different model". A store an earlier attempt created but never committed a
sample to (by an older version, or a kill) holds nothing and is replaced; one with committed samples never is.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from eagle_batch.errors import UserError

from .export import check_out_folder
from .hf_arrow import STATE_FILE, read_hf_rows
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


def _check_source(src: Path) -> None:
    """UserError naming what is missing unless `src` looks like a speculators data folder."""
    what = (
        "give the folder speculators' prepare-data wrote (a `datasets` save_to_disk folder) with "
        f"generate-offline-data's {HS_DIR}/ inside"
    )
    if not src.exists():
        raise UserError(f"SRC {src} does not exist; {what}.")
    if not src.is_dir():
        raise UserError(f"SRC {src} is a file, not a folder; {what}.")
    missing = [
        name
        for name, there in (
            (f"{STATE_FILE} (the dataset of token ids)", (src / STATE_FILE).is_file()),
            (f"{HS_DIR}/ (the hidden states)", (src / HS_DIR).is_dir()),
        )
        if not there
    ]
    if missing:
        raise UserError(f"SRC {src} is not a speculators data folder: no {' and no '.join(missing)}; {what}.")
    if not (src / HS_DIR / "hs_0.safetensors").is_file():
        raise UserError(
            f"SRC {src}: {src / HS_DIR} has no hs_0.safetensors: the hidden states were not generated (run "
            "speculators' generate-offline-data on this folder) or were not copied completely."
        )


def _rows(src: Path) -> Iterator[dict]:
    """The folder's rows; an Arrow file that cannot be read is a UserError naming SRC, not a traceback."""
    import pyarrow as pa

    try:
        yield from read_hf_rows(src, ["input_ids", "loss_mask"], optional=("sample_id",))
    except (pa.ArrowException, OSError) as e:
        raise UserError(
            f"SRC {src}: its dataset files cannot be read ({type(e).__name__}: {e}); the folder is damaged or "
            "incomplete: copy or generate it again."
        ) from None


def _check_sample(f: Path, hs: dict, row: dict, i: int, n_aux: int, hidden_size: int) -> tuple:
    """(states, input_ids) of row i and its file `f`, or a UserError naming the file and what disagrees."""
    states, ids = hs.get("hidden_states"), np.asarray(row["input_ids"], dtype=np.int64)
    if states is None or tuple(states.shape[1:]) != (n_aux + 1, hidden_size):
        held = (
            f"; the file holds {states.shape[1]} layers per token, so give {states.shape[1] - 1} ids to --aux-layer-ids"
            if states is not None and states.dim() == 3 and states.shape[1] != n_aux + 1
            else ""
        )
        raise UserError(
            f"{f}: hidden_states {None if states is None else tuple(states.shape)} is not "
            f"[T, {n_aux + 1}, {hidden_size}] (the {n_aux} aux layers of --aux-layer-ids "
            f"and the last layer){held}"
        )
    if "token_ids" in hs and not np.array_equal(hs["token_ids"].numpy().astype(np.int64), ids):
        raise UserError(f"{f}: token_ids differ from row {i}'s input_ids; the folder mixes two datasets")
    return states, ids


def _clear_if_empty_and_other(store: Path, spec) -> bool:
    """Empty `store` (keeping its lock file) if an earlier attempt created it with another spec and it has
    no committed sample: it holds nothing, and the writer would refuse it as "written for a different
    model/config". Under the store's lock, and only on a record that reads as zero samples and zero tokens:
    a store whose record cannot be read is left to the writer's error, never removed."""
    from eagle_batch.store import StoreError, StoreSpec
    from eagle_batch.store.format import LOCK_NAME, PROGRESS_NAME, read_attrs
    from eagle_batch.store.lock import StoreLock
    from eagle_batch.store.record import read_record

    if not (store / PROGRESS_NAME).is_file():
        return False
    lock = StoreLock(store)  # StoreLockedError if another writer has it: nothing is touched then
    try:
        try:
            record = read_record(store)
            stored = StoreSpec.from_attributes(read_attrs(store))
        except (StoreError, TypeError, ValueError):
            return False
        if record.get("num_samples") != 0 or record.get("num_tokens") != 0 or not spec.mismatches(stored):
            return False
        for child in store.iterdir():
            if child.name != LOCK_NAME:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        return True
    finally:
        lock.release()


def _checked_first_row(src: Path, rows: Iterator[dict], num_aux: int) -> tuple[dict, int]:
    """(the first row, the hidden size) once that row and its states match the options: checked before the
    store exists (module docstring), so a wrong option leaves nothing behind. The states are read again
    with the rest: nothing is held across the import."""
    first_row = next(rows, None)
    if first_row is None:
        raise UserError(f"SRC {src}: its dataset has no rows: nothing to import.")
    f0 = src / HS_DIR / "hs_0.safetensors"
    hs0 = _load_states(f0)
    first = hs0.get("hidden_states")
    if first is None or first.dim() != 3:
        found = "no 'hidden_states'" if first is None else f"hidden_states of shape {tuple(first.shape)}"
        raise UserError(
            f"{f0}: {found}, not [T, layers, hidden size]; not a speculators hidden-states file (regenerate it)"
        )
    hidden_size = int(first.shape[-1])
    _check_sample(f0, hs0, first_row, 0, num_aux, hidden_size)
    return first_row, hidden_size


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

    src, store = Path(src), Path(store)
    aux = [int(k) for k in aux_layer_ids]
    n = int(num_hidden_layers)
    if not aux or aux != sorted(set(aux)) or aux[-1] >= n or aux[0] < 0:
        raise UserError(
            f"--aux-layer-ids {aux}: give the aux layer ids (vLLM's convention) ascending, each below "
            f"--num-hidden-layers {n}"
        )
    _check_source(src)
    check_out_folder(store, "STORE", "a task store")
    rows = _rows(src)
    first_row, hidden_size = _checked_first_row(src, rows, len(aux))
    spec = StoreSpec(
        layer_ids=[*aux, n],
        hidden_size=hidden_size,
        num_hidden_layers=n,
        model_name=model_name,
        extra={"imported_from": "speculators"},
    )
    replaced = _clear_if_empty_and_other(store, spec)
    writer = TaskStoreWriter.open(store, spec, store_cfg or StoreConfig())
    added = skipped = 0
    try:
        done = writer.committed_sample_ids

        def all_rows():
            yield first_row
            yield from rows

        for i, row in each(enumerate(all_rows())):
            sid = str(row.get("sample_id") or f"row-{i:08d}")
            if sid in done:
                skipped += 1
                continue
            f = src / HS_DIR / f"hs_{i}.safetensors"
            hs = _load_states(f)
            states, ids = _check_sample(f, hs, row, i, len(aux), spec.hidden_size)
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
    out = {"store": str(store), "added": added, "skipped": skipped, "layer_ids": spec.layer_ids}
    if replaced:
        out["replaced_empty_store"] = True
    return out

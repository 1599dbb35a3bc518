"""Export a run's samples into a peer trainer's files, streaming and resumable.

One sample at a time from `open_dataset` (only the layers the peer needs, decoded chunk by chunk), each
written to a temporary name, fsynced and renamed, then recorded in OUT's manifest (manifest.py). A rerun
skips every sample recorded with the same id and source digest (the stored bytes it was written from)
whose file exists, and rewrites the others (a repaired shard's samples); the peer's closing files (a dataset index,
token counts) are rewritten from the token arrays alone, which is cheap. Nothing holds more than one sample.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from eagle_batch.errors import UserError
from eagle_batch.store import StoreDataset
from eagle_batch.store.damage import DamagedSamples
from eagle_batch.store.durable import makedirs_durable, partial_name, publish
from eagle_batch.store.errors import DamagedDataError
from eagle_batch.store.format import PARTIAL_SUFFIX
from eagle_batch.store.provenance import write_sources

from .layers import PeerLayers
from .manifest import ExportManifest

Each = Callable[[Iterable], Iterable]  # wraps a loop, e.g. in a progress bar


class PeerFormat(Protocol):
    """One peer trainer's on-disk layout (speculators.py, specforge.py)."""

    name: str
    layers: PeerLayers

    def identity(self) -> dict:
        """What must agree for a rerun to continue an existing export (layers, norm weights...)."""
        ...

    def peer_layer_ids(self) -> dict:
        """The layer ids to give the peer's trainer, in its own convention."""
        ...

    def sample_path(self, i: int) -> str:
        """Sample i's file, relative to OUT."""
        ...

    def write_sample(self, path: Path, input_ids: np.ndarray, loss_mask: np.ndarray, hidden_bits: np.ndarray) -> None:
        """Write one sample to `path`; hidden_bits: uint16 [T, len(layers.ids), H] in `layers.ids` order."""
        ...

    def finish(self, out: Path, ds: StoreDataset, fingerprint: str, fsync: bool, each: Each) -> dict:
        """Files written once every sample is (an index, statistics); returns a summary."""
        ...


@dataclass
class ExportResult:
    out: Path
    num_samples: int
    written: int
    skipped: int
    summary: dict


def check_out_folder(path: Path, arg: str, what: str) -> None:
    """UserError, before anything is read or written, unless `path` can be a folder: it is one, or it and
    its missing parents can be created (no part of it is a file). `arg` names the argument, `what` the
    folder's use, for the message."""
    if path.exists() and not path.is_dir():
        raise UserError(
            f"{arg} {path} is a file, but {what} is a folder; give a new folder path (or the folder of an earlier "
            "run of this command, to resume), or move the file away."
        )
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{arg} {path}: {parent} is a file, not a folder; choose a path under a folder.")
            break


def _ids_sha256(view: StoreDataset) -> str:
    """The source's sample ids, in order, as one hash (from the committed records: no array read)."""
    h = hashlib.sha256()
    for i in range(len(view)):
        h.update(view.sample_id(i).encode() + b"\0")
    return h.hexdigest()


def _write_one(out: Path, rel: str, peer: PeerFormat, x: dict, fsync: bool) -> None:
    path = out / rel
    makedirs_durable(path.parent, fsync=fsync)  # a new rows_* folder's entry survives too
    tmp = partial_name(path)
    try:
        peer.write_sample(tmp, x["input_ids"], x["loss_mask"], x["hidden_states"])
        publish(tmp, path, fsync)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def export(
    ds: StoreDataset,
    source: str,
    out: Path,
    peer: PeerFormat,
    *,
    fsync: bool = True,
    each: Each = lambda it: it,
    each_token: Each = lambda it: it,
    on_damaged: str = "fail",
) -> ExportResult:
    """Write `ds` (a dataset of the run, any layers) as `peer`'s files under `out`; resumes an export there.

    A sample whose stored data fail their checksum stops the export (`on_damaged="fail"`, the reader's
    DamagedDataError), or (`"skip"`) is left out with a warning line, every other sample is written, and the
    export ends with a UserError counting and naming them: it is incomplete (a peer's index lists every
    sample) until they are repaired and export-data is run again into `out`, which writes only what is missing."""
    damaged = DamagedSamples(on_damaged, "eagle-batch export-data")
    view = ds.with_layers(peer.layers.ids)
    n = len(view)
    # The source's identity too: a rerun over other data with the same ids and count must not skip samples.
    identity = {**peer.identity(), "num_samples": n, "sample_ids_sha256": _ids_sha256(view)}
    identity["config_hash"] = ds.spec.config_hash
    manifest = ExportManifest.open(out, peer.name, source, identity, n, fsync=fsync)
    for stray in out.rglob(f"*{PARTIAL_SUFFIX}"):  # a killed export's temporaries
        stray.unlink()
    done = manifest.done()
    written = skipped = 0
    try:
        for i in each(range(n)):
            sid, src = view.sample_id(i), view.sample_digest(i)
            rel = peer.sample_path(i)
            if done.get(i) == (sid, src) and (out / rel).is_file():  # written from these very bytes
                skipped += 1
                continue
            try:
                x = view.get_arrays(i)
            except DamagedDataError as e:
                damaged.handle(e, sid)
                continue
            _write_one(out, rel, peer, x, fsync)
            manifest.mark(i, sid, src)
            written += 1
        if damaged.skipped:
            raise UserError(
                f"{damaged.summary()}. {out} holds the other {written + skipped} samples but is incomplete (no "
                f"index was written): after the repair, run the same export-data into {out} again; it writes only "
                "the missing samples."
            )
        fingerprint = hashlib.sha256(repr(sorted(identity.items())).encode()).hexdigest()[:16]
        summary = peer.finish(out, view, fingerprint, fsync, each_token)
        sources = view.sources()
        write_sources(
            out, sources, f"eagle-batch export-data {source} {out} --format {peer.name} (rewrites what changed)"
        )
        manifest.complete(peer_layer_ids=peer.peer_layer_ids(), sources=sources, **summary)
    finally:
        manifest.close()
    return ExportResult(out, n, written, skipped, {"peer_layer_ids": peer.peer_layer_ids(), **summary})

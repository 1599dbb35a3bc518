"""Fault campaign: N seeded single-bit flips across every file of a small committed, aggregated run (hidden
states, input ids, loss masks, the offsets and sample_ids arrays, every zarr.json, the committed records, the
complete markers, dataset.json). After each flip, on a fresh copy of the run, three readers run:

- the trainer's data path (`token_frequencies` and one epoch of the trainer's loader, `EpochLoader`, exactly what
  `train` steps consume; the real `train --local` runs in test_damaged_data.py),
- `export-data` (the in-process `export`, speculators format),
- `verify`.

Each reader refuses the flip (an error naming it), names it (verify's problems) or consumes it; a reader that
consumes it must deliver output byte-identical to the undamaged run's (a flip in a byte no reader uses, e.g.
a timestamp: "harmless"). Anything else is consumed silently, which the test forbids. The counts are printed
(`pytest -s`) and reported in docs/explanation/integrity.md.
"""

from __future__ import annotations

import hashlib
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from damaged_run import build_run, flip

from eagle_batch.errors import UserError

N_FLIPS = 48
SEED = 20


def _categories(run: Path) -> dict[str, list[Path]]:
    """Every file of the run by what it is (one category per array / metadata kind, both stores pooled)."""
    cats: dict[str, list[Path]] = {}
    for f in sorted(p for p in run.rglob("*") if p.is_file() and ".lock" not in p.name):
        rel = f.relative_to(run).parts
        if rel[0] != "stores":
            cats.setdefault(rel[-1], []).append(f)  # dataset.json
            continue
        inner = rel[2:]
        kind = inner[0] if len(inner) > 1 else inner[0]  # array name, or progress.json / zarr.json / complete
        if len(inner) > 1:
            kind += "/zarr.json" if inner[-1] == "zarr.json" else " data"
        cats.setdefault(kind, []).append(f)
    return cats


def _loader_digest(run: Path) -> str:
    from eagle_batch.store import open_dataset
    from eagle_batch.train.data import BatchPlan, EpochLoader, TrainSamples, token_frequencies

    ds = open_dataset(run)
    h = hashlib.sha256(repr((ds.layer_ids, [ds.sample_id(i) for i in range(len(ds))])).encode())
    h.update(token_frequencies(ds, 512).tobytes())
    samples = TrainSamples(ds, ds.layer_ids[:3], ds.layer_ids[3])
    plan = BatchPlan(samples.lengths(), 256, 0, 1)
    stream = EpochLoader(samples, plan, 0, num_workers=0).stream()
    for epoch, _, batch in stream:
        if epoch > 0:
            break
        for k in ("input_ids", "loss_mask", "aux", "last", "index"):
            h.update(batch[k].float().numpy().tobytes())  # exact: bf16 and small integers fit float32
    stream.close()
    return h.hexdigest()


def _export_digest(run: Path, out: Path) -> str:
    from eagle_batch.interop.export import export
    from eagle_batch.interop.layers import peer_layers
    from eagle_batch.interop.speculators import SpeculatorsFormat
    from eagle_batch.store import open_dataset

    shutil.rmtree(out, ignore_errors=True)
    ds = open_dataset(run)
    export(ds, str(run), out, SpeculatorsFormat(peer_layers(ds.layer_ids, 6, str(run))), fsync=False)
    h = hashlib.sha256()
    for f in sorted(p for p in out.rglob("*") if p.is_file() and not p.name.startswith("eagle-batch-")):
        # the peer's files (not our records); torch.save's zip differs run to run around the same counts
        data = repr(sorted(torch.load(f).items())).encode() if f.suffix == ".pt" else f.read_bytes()
        h.update(str(f.relative_to(out)).encode() + data)
    return h.hexdigest()


def _outcome(fn) -> tuple[str, str | None]:
    """("refused", message) when the reader raised a user-facing error, else ("read", its output digest)."""
    try:
        return "read", fn()
    except UserError as e:  # StoreError, DamagedDataError, ConfigError: one line for the user
        return "refused", str(e)


def test_every_flip_is_refused_named_or_harmless(tmp_path, capsys):
    from eagle_batch.store import verify

    pristine, _ = build_run(tmp_path / "pristine")
    work, out = tmp_path / "work" / "run", tmp_path / "work" / "out"
    shutil.copytree(pristine, work)
    ref_loader, ref_export = _loader_digest(work), _export_digest(work, out)
    assert verify(work) == []

    cats = _categories(pristine)
    names = sorted(cats)
    rng = np.random.default_rng(SEED)
    counts: Counter = Counter()
    silent = []
    for j in range(N_FLIPS):
        kind = names[j % len(names)]  # every kind of file in turn
        src = cats[kind][int(rng.integers(len(cats[kind])))]
        offset = int(rng.integers(src.stat().st_size))
        shutil.rmtree(work)
        shutil.copytree(pristine, work)
        target = work / src.relative_to(pristine)
        flip(target, offset, 1 << int(rng.integers(8)))
        what = f"{src.relative_to(pristine)} byte {offset}"
        verdicts = {}
        for reader, fn, ref in (
            ("train data path", lambda: _loader_digest(work), ref_loader),
            ("export-data", lambda: _export_digest(work, out), ref_export),
        ):
            how, got = _outcome(fn)
            verdicts[reader] = "refused" if how == "refused" else ("harmless" if got == ref else "SILENT")
        try:
            problems = verify(work)
            verdicts["verify"] = "named" if problems else "clean"
        except UserError:
            verdicts["verify"] = "refused"
        # verify finding nothing is harmless only if every data reader read what the undamaged run holds
        if verdicts["verify"] == "clean":
            verdicts["verify"] = (
                "harmless" if all(v == "harmless" for v in verdicts.values() if v != "clean") else "SILENT"
            )
        for reader, v in verdicts.items():
            counts[(reader, v)] += 1
            if v == "SILENT":
                silent.append(f"{reader}: {what}")
        counts[("flip", kind)] += 1
    with capsys.disabled():
        print(f"\nflip campaign: {N_FLIPS} flips (seed {SEED}) over {len(names)} kinds of file: {names}")
        for reader in ("train data path", "export-data", "verify"):
            row = {v: n for (r, v), n in counts.items() if r == reader}
            print(f"  {reader}: {row}")
    assert not silent, silent

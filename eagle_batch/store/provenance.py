"""What derived data were made from: the committed records of the stores they read, and whether those moved on.

Everything derived from task stores records, per store, the digest of the committed record it read
(`record_digest`: the commit number and the record's own crc32c, read from progress.json; no data
re-hashed): the aggregate view (each entry of RUN/dataset.json), an export-data folder (its manifest) and a
trained draft (`SOURCES_NAME` in its export folder, and its checkpoints). A repair, a resume or a re-extraction
commits a new record, so `stale_sources` names every store whose record is no longer the one read, and
`verify` reports the derived output as stale with the command that makes it again.
"""

from __future__ import annotations

import json
from pathlib import Path

from .crc import SEAL_KEY, json_crc32c
from .errors import StoreError

SOURCES_NAME = "eagle-batch-sources.json"  # in a trained draft's export folder: {"stores": {path: digest}}


def record_digest(record: dict) -> str:
    """The identity of one committed record: "commit N crc32c XXXXXXXX" (its seal, or computed for a store
    written before records were sealed)."""
    seal = record.get(SEAL_KEY)
    crc = int(seal) if seal is not None else json_crc32c(record)
    return f"commit {int(record.get('commit', 0))} crc32c {crc:08x}"


def current_digest(store: Path) -> str | None:
    """The digest of a store's committed record now (None when the store or its record cannot be read)."""
    from .record import read_record

    try:
        return record_digest(read_record(store))
    except (StoreError, OSError):
        return None


def stale_sources(sources: dict[str, str]) -> list[str]:
    """`path: what changed` for each store of `sources` ({store path: digest read}) whose record moved on."""
    out = []
    for path, digest in sorted(sources.items()):
        now = current_digest(Path(path))
        if now != digest:
            out.append(f"{path}: read at {digest}, now {now or 'missing or unreadable'}")
    return out


def write_sources(folder: Path, sources: dict[str, str], remake: str) -> None:
    """`folder/SOURCES_NAME`: the stores a derived output (a trained draft, an export) was made from, and the
    command that makes it again (`remake`, for the stale report)."""
    text = json.dumps({"stores": sources, "remake": remake}, indent=1, sort_keys=True) + "\n"
    (folder / SOURCES_NAME).write_text(text)


def derived_outputs(path: Path) -> list[Path]:
    """The derived outputs at `path`: itself if it holds SOURCES_NAME, else a run's trained drafts
    (RUN/train/*/export)."""
    if (path / SOURCES_NAME).is_file():
        return [path]
    return sorted(p.parent for p in path.glob(f"train/*/export/{SOURCES_NAME}"))


def stale_report(folder: Path) -> str | None:
    """One line when the derived output `folder` was made from committed records that have changed since
    (a repair, a resume): what changed and what to rerun; None when it is current."""
    try:
        info = json.loads((folder / SOURCES_NAME).read_text())
        stale = stale_sources(dict(info["stores"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{folder}: {SOURCES_NAME} is unreadable ({e}); make this output again"
    if not stale:
        return None
    return (
        f"{folder} is stale: made from data that changed since ({'; '.join(stale[:3])}"
        f"{f'; +{len(stale) - 3} more' if len(stale) > 3 else ''}); make it again: {info.get('remake', '')}"
    )

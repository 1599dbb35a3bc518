"""The export's record in OUT: what it was made from and with what, and which samples are done.

    OUT/eagle-batch-export.json   {"format": "eagle-batch-export", "format_version": 1, "peer", "source",
                                   "identity": {...}, "num_samples", "complete": bool, ...}
    OUT/eagle-batch-export.done   one JSON line per finished sample: {"i": index, "id": sample_id, "src": digest}

`src` is the digest of the stored bytes the sample's file was written from (StoreDataset.sample_digest):
a rerun rewrites every file whose source changed since (a repaired shard), not only the missing ones. The
complete manifest lists the committed record of every source store (`sources`, provenance.py), which
`eagle-batch verify OUT` compares with the stores as they are now.

A line is appended (and fsynced) only after the sample's file is renamed into place and its directory
fsynced, so a listed sample's file is whole. A kill can leave a torn last line, which is dropped on
reopening. Reopening with another identity (another source store, other layers, another target norm) is
refused: its files would mix two exports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagle_batch.errors import UserError
from eagle_batch.store.durable import write_json_atomic

MANIFEST_NAME = "eagle-batch-export.json"
DONE_NAME = "eagle-batch-export.done"
FORMAT = "eagle-batch-export"
FORMAT_VERSION = 1


class ExportManifest:
    def __init__(self, out: Path, header: dict[str, Any], fsync: bool):
        self.out = out
        self.header = header
        self.fsync = fsync
        self._done_f = None

    @classmethod
    def open(cls, out: Path, peer: str, source: str, identity: dict, num_samples: int, fsync: bool = True):
        """Create OUT's record, or reopen one made with the same identity (else a UserError)."""
        out.mkdir(parents=True, exist_ok=True)
        header = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "peer": peer,
            "source": source,
            "identity": identity,
            "num_samples": num_samples,
            "complete": False,
        }
        path = out / MANIFEST_NAME
        if path.is_file():
            try:
                old = json.loads(path.read_text())
            except ValueError as e:
                raise UserError(f"{path} is not valid JSON ({e}); delete {out} and export again") from None
            same = (old.get("peer"), old.get("identity"), old.get("num_samples")) == (peer, identity, num_samples)
            if not same:
                raise UserError(
                    f"{out} holds a {old.get('peer')} export of other data or options ({path}: identity "
                    f"{old.get('identity')}, {old.get('num_samples')} samples); export into an empty folder, "
                    "or delete it"
                )
        elif any(out.iterdir()):
            raise UserError(f"{out} is not empty and has no {MANIFEST_NAME}; export into an empty or new folder")
        write_json_atomic(path, header, fsync=fsync)
        return cls(out, header, fsync)

    def done(self) -> dict[int, tuple[str, str | None]]:
        """index -> (sample id, source digest) of every sample recorded as finished (a torn last line is cut
        off; a line written before digests were recorded has None)."""
        path = self.out / DONE_NAME
        if not path.is_file():
            return {}
        raw = path.read_bytes()
        whole = raw[: raw.rfind(b"\n") + 1]
        if len(whole) != len(raw):  # a kill mid-line: appending after it would glue two records together
            with open(path, "r+b") as f:
                f.truncate(len(whole))
        out: dict[int, tuple[str, str | None]] = {}
        for line in whole.decode().splitlines():
            rec = json.loads(line)
            out[int(rec["i"])] = (str(rec["id"]), rec.get("src"))
        return out

    def mark(self, index: int, sample_id: str, source_digest: str) -> None:
        if self._done_f is None:
            self._done_f = open(self.out / DONE_NAME, "ab")
        self._done_f.write(json.dumps({"i": index, "id": sample_id, "src": source_digest}).encode() + b"\n")
        self._done_f.flush()
        if self.fsync:
            os.fsync(self._done_f.fileno())

    def complete(self, **summary: Any) -> None:
        self.close()
        self.header = {**self.header, **summary, "complete": True}
        write_json_atomic(self.out / MANIFEST_NAME, self.header, fsync=self.fsync)

    def close(self) -> None:
        if self._done_f is not None:
            self._done_f.close()
            self._done_f = None

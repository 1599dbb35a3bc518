"""An HF `datasets` folder, as `Dataset.save_to_disk` writes it, streamed with pyarrow (no `datasets` import).

    OUT/data-00000-of-00001.arrow   Arrow IPC *stream* (not file) format, record batches appended as rows come
    OUT/dataset_info.json           {"description": ...}: no "features", so `load_from_disk` infers them from
                                    the Arrow schema (list<int64> -> List(Value("int64")) in every version)
    OUT/state.json                  which files, the fingerprint, and the format `ds[i]` returns ("torch")

`datasets.load_from_disk(OUT)` reads exactly these (datasets 4.x-5.x: `Dataset.load_from_disk` reads
state.json's `_data_files` with `pa.ipc.open_stream`). The Arrow file is written to a temporary name and
renamed; state.json comes last, so a folder with it is whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from eagle_batch.store.durable import partial_name, publish, write_json_atomic

DATA_FILE = "data-00000-of-00001.arrow"
STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"


class HFDatasetWriter:
    """Rows in, one save_to_disk folder out; `close()` publishes it."""

    def __init__(self, folder: Path, schema: pa.Schema, format_type: str | None, batch_rows: int = 1024):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.format_type = format_type
        self.batch_rows = batch_rows
        self.rows = 0
        self._pending: list[dict[str, Any]] = []
        self._tmp = partial_name(self.folder / DATA_FILE)
        self._sink = pa.OSFile(str(self._tmp), "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema)

    def add(self, row: dict[str, Any]) -> None:
        self._pending.append(row)
        if len(self._pending) >= self.batch_rows:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._writer.write_batch(pa.RecordBatch.from_pylist(self._pending, schema=self.schema))
            self.rows += len(self._pending)
            self._pending = []

    def close(self, fingerprint: str, description: str, fsync: bool = True) -> int:
        """Write the rest, rename the Arrow file into place, then dataset_info.json and state.json; the row count."""
        self._flush()
        self._writer.close()
        self._sink.close()
        publish(self._tmp, self.folder / DATA_FILE, fsync)
        write_json_atomic(self.folder / INFO_FILE, {"description": description}, fsync=fsync)
        state = {
            "_data_files": [{"filename": DATA_FILE}],
            "_fingerprint": fingerprint,
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": self.format_type,
            "_output_all_columns": False,
            "_split": None,
        }
        write_json_atomic(self.folder / STATE_FILE, state, fsync=fsync)
        return self.rows

    def abort(self) -> None:
        self._writer.close()
        self._sink.close()
        self._tmp.unlink(missing_ok=True)


def read_hf_rows(folder: Path, columns: list[str], optional: tuple[str, ...] = ()):
    """Rows of a save_to_disk folder (its state.json's files, in order) as dicts of Python values, batch by
    batch, with `columns` (each required) and those of `optional` the folder has: what `import-data` reads,
    without `datasets`."""
    import json

    from eagle_batch.errors import UserError

    folder = Path(folder)
    try:
        state = json.loads((folder / STATE_FILE).read_text())
        files = [folder / f["filename"] for f in state["_data_files"]]
    except FileNotFoundError:
        raise UserError(
            f"{folder / STATE_FILE} is missing: {folder} is not a `datasets` save_to_disk folder "
            "(speculators' prepare-data output)"
        ) from None
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{folder / STATE_FILE}: not a `datasets` state file ({e})") from None
    for f in files:
        with pa.memory_map(str(f)) as src:
            reader = pa.ipc.open_stream(src)
            names = reader.schema.names
            missing = [c for c in columns if c not in names]
            if missing:
                raise UserError(f"{f}: no column {', '.join(missing)} (it has {', '.join(names)})")
            take = list(columns) + [c for c in optional if c in names]
            for batch in reader:
                yield from batch.select(take).to_pylist()

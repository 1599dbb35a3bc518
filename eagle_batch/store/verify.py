"""verify(path) -> list[Problem]: re-check a task store (or every store of a run) against its record.

Checks, per store: the committed record (counts, lengths, unique ids); metadata (group attributes, each
array's data type, row shape, layout, and a shape never ahead of the record); per committed shard: the
file exists, has the recorded size and crc32c, its index decodes, every covered inner chunk decodes to
rows whose crc32c matches the record; NaN/Inf in hidden states, loss_mask outside {0, 1}, negative
input ids; files the record does not cover (`*.partial`, shards past the record); for complete stores
the `offsets` and `sample_ids` arrays and the `complete` marker. Each Problem names the store, the
array and shard, and the samples a damaged shard covers (what a repair must recompute).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import crc32c
import numpy as np

from .format import (
    ARRAY_DTYPES,
    COMPLETE_NAME,
    EMPTY,
    PARTIAL_SUFFIX,
    PROGRESS_NAME,
    TOKEN_ARRAYS,
    ArrayLayout,
    ShardError,
    decode_index,
    make_decoder,
)
from .reader import DATASET_NAME, read_attrs, read_record
from .spec import StoreError, StoreSpec
from .writer import committed_samples_of_shard


@dataclass
class Problem:
    store: str
    kind: str  # record | metadata | missing | truncated | checksum | decode | values | stray | offsets | index
    message: str
    array: str | None = None
    shard: int | None = None
    file: str | None = None
    samples: list[int] = field(default_factory=list)  # sample indices (in the store) the damage covers
    sample_ids: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        where = self.store
        if self.array is not None:
            where += f": {self.array}"
        if self.shard is not None:
            where += f" shard {self.shard}"
        if self.file:
            where += f" ({self.file})"
        s = f"{where}: {self.kind}: {self.message}"
        if self.samples:
            ids = ", ".join(self.sample_ids[:3]) + (", ..." if len(self.sample_ids) > 3 else "")
            s += f" [covers samples {self.samples[0]}..{self.samples[-1]} ({len(self.samples)}): {ids}]"
        return s

    def to_dict(self) -> dict:
        return asdict(self)


def store_paths(path: Path) -> list[Path]:
    if (path / PROGRESS_NAME).is_file() or (path / "zarr.json").is_file() and not (path / "stores").is_dir():
        return [path]
    if (path / "stores").is_dir():
        return sorted(p for p in (path / "stores").iterdir() if p.is_dir() and p.name.endswith(".zarr"))
    raise StoreError(f"{path} is neither a task store nor a run directory (no {PROGRESS_NAME}, no stores/)")


def verify(path, check_values: bool = True) -> list[Problem]:
    """All problems of a task store, or of every task store of a run (plus its dataset.json)."""
    path = Path(path)
    problems: list[Problem] = []
    for store in store_paths(path):
        problems += verify_store(store, check_values)
    if (path / DATASET_NAME).is_file():
        problems += _verify_dataset_index(path)
    return problems


def _verify_dataset_index(run: Path) -> list[Problem]:
    out = []
    try:
        index = json.loads((run / DATASET_NAME).read_text())
    except ValueError as e:
        return [Problem(str(run / DATASET_NAME), "index", f"not valid JSON ({e}); rerun `eagle-batch aggregate {run}`")]
    for entry in index.get("stores", []):
        p = run / entry["path"]
        try:
            done = json.loads((p / COMPLETE_NAME).read_text())
        except (OSError, ValueError):
            out.append(
                Problem(str(p), "index", f"listed in {DATASET_NAME} but not complete; rerun `eagle-batch aggregate`")
            )
            continue
        if done.get("num_samples") != entry.get("num_samples") or done.get("num_tokens") != entry.get("num_tokens"):
            out.append(
                Problem(
                    str(p),
                    "index",
                    f"{DATASET_NAME} says {entry.get('num_samples')} samples / "
                    f"{entry.get('num_tokens')} tokens, the store {done.get('num_samples')} / "
                    f"{done.get('num_tokens')}; rerun `eagle-batch aggregate {run}`",
                )
            )
    return out


def verify_store(store: Path, check_values: bool = True) -> list[Problem]:
    S = str(store)
    out: list[Problem] = []
    try:
        record = read_record(store)
    except StoreError as e:
        return [Problem(S, "record", str(e))]
    try:
        spec = StoreSpec.from_attributes(read_attrs(store))
    except (StoreError, TypeError, ValueError) as e:
        return [Problem(S, "metadata", f"group attributes: {e}")]

    # The record itself.
    n, t = record.get("num_samples"), record.get("num_tokens")
    ids, lengths = record.get("sample_ids", []), record.get("lengths", [])
    if not (len(ids) == len(lengths) == n):
        out.append(
            Problem(S, "record", f"{PROGRESS_NAME}: num_samples={n} but {len(ids)} ids and {len(lengths)} lengths")
        )
    if sum(lengths) != t:
        out.append(Problem(S, "record", f"{PROGRESS_NAME}: lengths sum to {sum(lengths)}, num_tokens is {t}"))
    if len(set(ids)) != len(ids):
        out.append(Problem(S, "record", f"{PROGRESS_NAME}: duplicate sample ids"))
    if any(x <= 0 for x in lengths):
        out.append(Problem(S, "record", f"{PROGRESS_NAME}: a sample has no tokens"))

    # Array metadata.
    layouts: dict[str, ArrayLayout] = {}
    for name in TOKEN_ARRAYS:
        mp = store / name / "zarr.json"
        try:
            meta = json.loads(mp.read_text())
            layouts[name] = lay = ArrayLayout.from_zarr_json(name, meta)
        except (OSError, ValueError, KeyError) as e:
            out.append(Problem(S, "metadata", f"{mp}: {e}", array=name))
            continue
        if meta.get("data_type") != ARRAY_DTYPES[name]:
            out.append(
                Problem(
                    S, "metadata", f"data_type {meta.get('data_type')!r}, expected {ARRAY_DTYPES[name]!r}", array=name
                )
            )
        want_rows = (spec.num_layers, spec.hidden_size) if name == "hidden_states" else ()
        if lay.row_shape != want_rows:
            out.append(Problem(S, "metadata", f"row shape {lay.row_shape}, attributes say {want_rows}", array=name))
        if meta["shape"][0] > t:
            out.append(
                Problem(
                    S,
                    "metadata",
                    f"shape {meta['shape'][0]} covers more than the {t} committed tokens (zarr would read zeros there)",
                    array=name,
                )
            )
    if set(layouts) != set(TOKEN_ARRAYS):
        return out

    # Shards.
    for lay in layouts.values():
        out += _verify_shards(store, record, lay, check_values)

    # Files nobody committed.
    for f in sorted(store.rglob("*" + PARTIAL_SUFFIX)):
        out.append(
            Problem(
                S,
                "stray",
                "temporary file of an interrupted write; reopening the store for writing removes it",
                file=str(f.relative_to(store)),
            )
        )

    # Finalized stores.
    if (store / COMPLETE_NAME).is_file():
        out += _verify_complete(store, record)
    return out


def _shard_problem(store: Path, record: dict, lay: ArrayLayout, k: int, kind: str, msg: str) -> Problem:
    samples = committed_samples_of_shard(record, lay.shard_tokens, k)
    return Problem(
        str(store),
        kind,
        msg,
        array=lay.name,
        shard=k,
        file=str(lay.shard_path(store, k).relative_to(store)),
        samples=samples,
        sample_ids=[record["sample_ids"][i] for i in samples if i < len(record["sample_ids"])],
    )


def _verify_shards(store: Path, record: dict, lay: ArrayLayout, check_values: bool) -> list[Problem]:
    out: list[Problem] = []
    t = record["num_tokens"]
    table = {int(s["index"]): s for s in record["shards"].get(lay.name, [])}
    n_shards = -(-t // lay.shard_tokens)
    for k in range(n_shards):
        want_tokens = min(lay.shard_tokens, t - k * lay.shard_tokens)
        info = table.get(k)
        if info is None or info["tokens"] != want_tokens:
            out.append(
                _shard_problem(
                    store,
                    record,
                    lay,
                    k,
                    "record",
                    f"the record covers {want_tokens} tokens here but its shard table has "
                    f"{'no entry' if info is None else info['tokens']}",
                )
            )
            continue
        f = lay.shard_path(store, k)
        if not f.is_file():
            out.append(_shard_problem(store, record, lay, k, "missing", "shard file is missing"))
            continue
        data = f.read_bytes()
        if info["tokens"] < lay.shard_tokens and (len(data) != info["nbytes"] or crc32c.crc32c(data) != info["crc32c"]):
            # A tail shard replaced by a commit that a kill interrupted before its record: harmless if the
            # committed prefix still checks out (the writer's open() restores exactly that prefix).
            p = _check_shard_values(lay, data, want_tokens, info, str(f))
            if p is None or p[0] == "values":
                out.append(
                    Problem(
                        str(store),
                        "stray",
                        "tail shard rewritten by an interrupted commit; its committed "
                        "rows check out (raw crc32c) and reopening the store for writing restores them",
                        array=lay.name,
                        shard=k,
                        file=str(f.relative_to(store)),
                    )
                )
                if p is not None and check_values:
                    out.append(_shard_problem(store, record, lay, k, *p))
                continue
        if len(data) != info["nbytes"]:
            out.append(
                _shard_problem(
                    store,
                    record,
                    lay,
                    k,
                    "truncated" if len(data) < info["nbytes"] else "size",
                    f"{len(data)} bytes, the record says {info['nbytes']}",
                )
            )
            continue
        if crc32c.crc32c(data) != info["crc32c"]:
            out.append(_shard_problem(store, record, lay, k, "checksum", "crc32c of the file differs from the record"))
            continue
        if check_values:
            p = _check_shard_values(lay, data, want_tokens, info, str(f))
            if p:
                out.append(_shard_problem(store, record, lay, k, *p))
    for k in sorted(set(table) - set(range(n_shards))):
        out.append(
            Problem(
                str(store),
                "record",
                f"shard table lists shard {k} past the {t} committed tokens",
                array=lay.name,
                shard=k,
            )
        )
    root = store / lay.name / "c"
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.name.isdigit() and int(d.name) >= n_shards:
                out.append(
                    Problem(
                        str(store),
                        "stray",
                        "shard past the committed record (an interrupted append); "
                        "reopening the store for writing removes it",
                        array=lay.name,
                        shard=int(d.name),
                        file=str(d.relative_to(store)),
                    )
                )
    return out


def _check_shard_values(lay: ArrayLayout, data: bytes, tokens: int, info: dict, where: str) -> tuple[str, str] | None:
    try:
        index = decode_index(data[-lay.index_nbytes() :], lay.chunks_per_shard, where)
    except ShardError as e:
        return "decode", str(e)
    dec = make_decoder(lay.codec)
    crc = 0
    nan = inf = bad = 0
    for c in range(-(-tokens // lay.chunk_tokens)):
        off, nb = index[c]
        if off == EMPTY:
            return "decode", f"inner chunk {c} is absent but the record covers it"
        try:
            rows = np.frombuffer(dec(data[int(off) : int(off + nb)]), lay.np_dtype)
        except Exception as e:  # codec errors come in many types
            return "decode", f"inner chunk {c} does not decode: {e}"
        per_chunk = lay.chunk_tokens * (lay.row_nbytes // lay.np_dtype.itemsize)
        if rows.size != per_chunk:
            return "decode", f"inner chunk {c} decodes to {rows.size} values, expected {per_chunk}"
        used = min(lay.chunk_tokens, tokens - c * lay.chunk_tokens)
        rows = rows[: used * (lay.row_nbytes // lay.np_dtype.itemsize)]
        crc = crc32c.crc32c(rows, crc)
        if lay.name == "hidden_states":
            special = (rows & 0x7F80) == 0x7F80  # bf16 exponent all ones: Inf (mantissa 0) or NaN
            if special.any():
                mant = rows[special] & 0x007F
                nan += int((mant != 0).sum())
                inf += int((mant == 0).sum())
        elif lay.name == "loss_mask":
            bad += int((rows > 1).sum())
        elif lay.name == "input_ids":
            bad += int((rows < 0).sum())
    if crc != info["raw_crc32c"]:
        return "checksum", "decoded rows' crc32c differs from the record"
    if nan or inf:
        return "values", f"{nan} NaN and {inf} Inf values in hidden states"
    if bad:
        return "values", f"{bad} values outside the valid range ({'0/1' if lay.name == 'loss_mask' else '>= 0'})"
    return None


def _verify_complete(store: Path, record: dict) -> list[Problem]:
    import warnings

    import zarr

    S = str(store)
    out = []
    try:
        done = json.loads((store / COMPLETE_NAME).read_text())
        if done.get("num_samples") != record["num_samples"] or done.get("num_tokens") != record["num_tokens"]:
            out.append(
                Problem(
                    S,
                    "record",
                    f"complete marker says {done.get('num_samples')} samples / "
                    f"{done.get('num_tokens')} tokens, the record {record['num_samples']} / "
                    f"{record['num_tokens']}",
                )
            )
    except (OSError, ValueError) as e:
        out.append(Problem(S, "record", f"complete marker unreadable: {e}"))
    want = np.concatenate([[0], np.cumsum(record["lengths"], dtype=np.int64)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            offsets = zarr.open_array(store / "offsets", mode="r")[:]
            if offsets.dtype != np.int64 or not np.array_equal(offsets, want):
                out.append(Problem(S, "offsets", "offsets array differs from the record's lengths", array="offsets"))
        except Exception as e:
            out.append(Problem(S, "offsets", f"offsets array unreadable: {e}", array="offsets"))
        try:
            ids = list(zarr.open_array(store / "sample_ids", mode="r")[:])
            if ids != record["sample_ids"]:
                out.append(Problem(S, "offsets", "sample_ids array differs from the record", array="sample_ids"))
        except Exception as e:
            out.append(Problem(S, "offsets", f"sample_ids array unreadable: {e}", array="sample_ids"))
    return out

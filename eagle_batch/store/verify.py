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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import crc32c
import numpy as np

from .aggregate import previous_index
from .crc import seal_problem
from .errors import ShardError, StoreError, extract_then_aggregate
from .format import (
    COMPLETE_NAME,
    DATASET_NAME,
    PARTIAL_SUFFIX,
    PROGRESS_NAME,
    SCALE_ARRAY,
    ArrayLayout,
    array_dtypes,
    read_attrs,
    task_stores,
)
from .fp8 import float8_for_encoding, special_codes
from .provenance import current_digest
from .record import (
    committed_samples_of_shard,
    expected_shards,
    read_record,
    record_problems,
    sample_bounds,
    shard_table,
    uncovered_shards,
)
from .shard_codec import ShardDecoder
from .spec import StoreSpec


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
    """The task stores at `path` (one store, or a run's RUN/stores/*.zarr); a StoreError saying what to run
    when there is none yet, so that verify never reports "OK" or index problems over nothing."""
    if (path / PROGRESS_NAME).is_file() or (path / "zarr.json").is_file() and not (path / "stores").is_dir():
        return [path]
    listed = len((previous_index(path) or {}).get("stores", []))
    if listed:  # an index over stores that are gone: its problems are not the point, the stores are
        next_step = (
            f"{DATASET_NAME} lists {listed} store(s) that are not there (deleted or moved?): put them back, or "
            f"extract again (`eagle-batch resume {path}`; `eagle-batch status {path}` shows where the run stands), "
            f"then `eagle-batch aggregate {path}` and verify again"
        )
    else:
        next_step = f"nothing has been extracted yet: {extract_then_aggregate(path)} and verify again"
    if (path / "stores").is_dir():
        stores = task_stores(path)
        if not stores:
            raise StoreError(f"{path}/stores holds no task store: {next_step}.")
        return stores
    if (path / "prepared").is_dir() or (path / "config.yaml").is_file():  # a run directory, not yet extracted
        raise StoreError(f"{path} is a run directory with no task store yet (no stores/): {next_step}.")
    if not path.exists():
        raise StoreError(f"{path} does not exist; give a task store (RUN/stores/task-00000.zarr) or a run directory.")
    raise StoreError(
        f"{path} is neither a task store nor a run directory (no {PROGRESS_NAME}, no stores/, no prepared/); "
        "give a task store (RUN/stores/task-00000.zarr) or a run directory."
    )


def verify(
    path, check_values: bool = True, each: Callable[[list[Path]], Iterable[Path]] = iter, jobs: int = 1
) -> list[Problem]:
    """All problems of a task store, or of every task store of a run (plus its dataset.json). `each` wraps
    the list of stores (a progress bar). `jobs` stores are checked at once, on threads (reading, crc32c and
    decoding release the GIL), so that a run of many small stores waits on the disk, not on one store's
    round trips after another; problems come in store order whatever `jobs` is."""
    path = Path(path)
    problems: list[Problem] = []
    stores = store_paths(path)
    if jobs <= 1 or len(stores) < 2:
        for store in each(stores):
            problems += verify_store(store, check_values)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="verify") as pool:
            results = pool.map(lambda s: verify_store(s, check_values), stores)
            for _store, found in zip(each(stores), results):
                problems += found
    if (path / DATASET_NAME).is_file():
        problems += _verify_dataset_index(path)
    return problems


def _verify_dataset_index(run: Path) -> list[Problem]:
    out = []
    try:
        index = json.loads((run / DATASET_NAME).read_text())
    except ValueError as e:
        return [Problem(str(run / DATASET_NAME), "index", f"not valid JSON ({e}); rerun `eagle-batch aggregate {run}`")]
    damaged = seal_problem(index) if isinstance(index, dict) else "it is not a JSON object"
    if damaged:
        return [Problem(str(run / DATASET_NAME), "index", f"damaged: {damaged}; rerun `eagle-batch aggregate {run}`")]
    for entry in index.get("stores", []):
        p = run / entry["path"]
        if not p.is_dir():
            msg = (
                f"listed in {DATASET_NAME} but the store does not exist (deleted or moved?); `eagle-batch resume "
                f"{run}` extracts its task again, then rerun `eagle-batch aggregate {run}`"
            )
            out.append(Problem(str(p), "index", msg))
            continue
        try:
            done = json.loads((p / COMPLETE_NAME).read_text())
        except (OSError, ValueError):
            msg = (
                f"listed in {DATASET_NAME} but not complete; finish it with `eagle-batch resume {run}`, then rerun "
                f"`eagle-batch aggregate {run}`"
            )
            out.append(Problem(str(p), "index", msg))
            continue
        now = current_digest(p)
        if entry.get("record") and now != entry["record"]:
            msg = (
                f"{DATASET_NAME} was made from its record at {entry['record']}, it is now at {now} (repaired or "
                f"resumed since): the view is stale; rerun `eagle-batch aggregate {run}`"
            )
            out.append(Problem(str(p), "stale", msg))
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

    out += [Problem(S, "record", msg) for msg in record_problems(record)]
    t = record.get("num_tokens")

    # Array metadata.
    layouts: dict[str, ArrayLayout] = {}
    dtypes = array_dtypes(spec.dtype)
    rows = {"hidden_states": (spec.num_layers, spec.hidden_size), SCALE_ARRAY: (spec.num_layers,)}
    for name, dtype in dtypes.items():
        mp = store / name / "zarr.json"
        try:
            meta = json.loads(mp.read_text())
            layouts[name] = lay = ArrayLayout.from_zarr_json(name, meta)
        except (OSError, ValueError, KeyError) as e:
            out.append(Problem(S, "metadata", f"{mp}: {e}", array=name))
            continue
        if meta.get("data_type") != dtype:
            msg = f"data_type {meta.get('data_type')!r}, expected {dtype!r} (store dtype {spec.dtype})"
            out.append(Problem(S, "metadata", msg, array=name))
            del layouts[name]  # its rows cannot be checked as that dtype
            continue
        want_rows = rows.get(name, ())
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
    if set(layouts) != set(dtypes):
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
    table = shard_table(record, lay.name)
    uncovered = {k: info for k, _, info in uncovered_shards(table, lay.shard_tokens, t)}
    decoder = ShardDecoder(lay)
    expected = expected_shards(lay.shard_tokens, t)
    for k, want in expected:
        if k in uncovered:
            have = "no entry" if uncovered[k] is None else uncovered[k]["tokens"]
            msg = f"the record covers {want} tokens here but its shard table has {have}"
            out.append(_shard_problem(store, record, lay, k, "record", msg))
        else:
            out += _verify_shard(store, record, lay, decoder, k, want, table[k], check_values)
    n_shards = len(expected)
    for k in sorted(set(table) - set(range(n_shards))):
        msg = f"shard table lists shard {k} past the {t} committed tokens"
        out.append(Problem(str(store), "record", msg, array=lay.name, shard=k))
    root = store / lay.name / "c"
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.name.isdigit() and int(d.name) >= n_shards:
                msg = "shard past the committed record (an interrupted append); reopening the store for writing removes it"
                out.append(
                    Problem(str(store), "stray", msg, array=lay.name, shard=int(d.name), file=str(d.relative_to(store)))
                )
    return out


def _verify_shard(
    store: Path, record: dict, lay: ArrayLayout, decoder: ShardDecoder, k: int, tokens: int, info: dict, values: bool
) -> list[Problem]:
    """Problems of committed shard k, which holds `tokens` committed rows and has the record entry `info`."""
    f = lay.shard_path(store, k)
    if not f.is_file():
        return [_shard_problem(store, record, lay, k, "missing", "shard file is missing")]
    data = f.read_bytes()
    if info["tokens"] < lay.shard_tokens and (len(data) != info["nbytes"] or crc32c.crc32c(data) != info["crc32c"]):
        # A tail shard replaced by a commit that a kill interrupted before its record: harmless if the
        # committed prefix still checks out (the writer's open() restores exactly that prefix).
        p = _check_shard_values(lay, decoder, data, tokens, info, str(f))
        if p is None or p[0] == "values":
            msg = (
                "tail shard rewritten by an interrupted commit; its committed rows check out (raw crc32c) and "
                "reopening the store for writing restores them"
            )
            out = [Problem(str(store), "stray", msg, array=lay.name, shard=k, file=str(f.relative_to(store)))]
            if p is not None and values:
                out.append(_shard_problem(store, record, lay, k, *p))
            return out
    if len(data) != info["nbytes"]:
        kind = "truncated" if len(data) < info["nbytes"] else "size"
        return [_shard_problem(store, record, lay, k, kind, f"{len(data)} bytes, the record says {info['nbytes']}")]
    if crc32c.crc32c(data) != info["crc32c"]:
        return [_shard_problem(store, record, lay, k, "checksum", "crc32c of the file differs from the record")]
    if values:
        p = _check_shard_values(lay, decoder, data, tokens, info, str(f))
        if p:
            return [_shard_problem(store, record, lay, k, *p)]
    return []


def _check_shard_values(
    lay: ArrayLayout, decoder: ShardDecoder, data: bytes, tokens: int, info: dict, where: str
) -> tuple[str, str] | None:
    """(kind, message) of the first problem of the shard's committed rows, or None: they decode (the one
    decoder of shard_codec), their crc32c matches the record, and their values are valid (no NaN/Inf hidden
    states, masks 0/1, token ids >= 0)."""
    crc = 0
    nan = inf = bad = 0
    try:
        for rows in decoder.chunks(data, tokens, where):
            crc = crc32c.crc32c(rows, crc)
            if lay.name == "hidden_states" and lay.data_type == "uint8":  # float8 codes: no NaN/Inf code
                n_nan, n_inf = special_codes(rows, float8_for_encoding(lay.encoding))
                nan, inf = nan + n_nan, inf + n_inf
            elif lay.name == "hidden_states":
                special = (rows & 0x7F80) == 0x7F80  # bf16 exponent all ones: Inf (mantissa 0) or NaN
                if special.any():
                    mant = rows[special] & 0x007F
                    nan += int((mant != 0).sum())
                    inf += int((mant == 0).sum())
            elif lay.name == SCALE_ARRAY:  # float8 row scales: finite, >= 0
                bad += int((~np.isfinite(rows)).sum() + (rows < 0).sum())
            elif lay.name == "loss_mask":
                bad += int((rows > 1).sum())
            elif lay.name == "input_ids":
                bad += int((rows < 0).sum())
    except ShardError as e:
        return "decode", e.detail
    if crc != info["raw_crc32c"]:
        return "checksum", "decoded rows' crc32c differs from the record"
    if nan or inf:
        return "values", f"{nan} NaN and {inf} Inf values in hidden states"
    if bad:
        valid = {"loss_mask": "0/1", SCALE_ARRAY: "finite, >= 0"}.get(lay.name, ">= 0")
        return "values", f"{bad} values outside the valid range ({valid})"
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
    want = sample_bounds(record["lengths"])
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

"""On-disk format of a task store: names, the bfloat16 Zarr data type, codecs, and each array's layout.

A task store is a Zarr v3 group. Token-major arrays (`hidden_states [T, L, H]`, `input_ids [T]`,
`loss_mask [T]`) share one token grid: `chunk_tokens`-row inner chunks inside `shard_tokens`-row shards
(ShardingCodec, index at the end, index codecs bytes + crc32c). We encode shard files ourselves (so a
whole shard is written once, fsynced and renamed, and compression runs on our own threads) in exactly
the layout zarr's ShardingCodec reads (shard_codec.py); tests check that plain `zarr.open_array` reads
them back. This module is the bottom of the package's imports (with errors.py): names and layouts only,
no file writes. See docs/reference/store-format.md for the full specification.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from .crc import seal_problem
from .errors import StoreCorruptError, StoreError

FORMAT_NAME = "eagle-batch-task-store"
# The newest format version this code reads and writes. A bfloat16 store is version 1 (what every eagle-batch
# reads); a float8 store is version 2 (format_version_for), which older eagle-batch refuses by its dtype.
FORMAT_VERSION = 2
PROGRESS_NAME = "progress.json"  # the committed record; the only thing readers trust
COMPLETE_NAME = "complete"  # written last by finalize()
LOCK_NAME = ".lock"
PARTIAL_SUFFIX = ".partial"  # temporaries of atomic writes (durable.py); never committed
DATASET_NAME = "dataset.json"  # RUN/dataset.json, the aggregate index (aggregate.py)
INDEX_ARRAYS = ("offsets", "sample_ids")  # written by finalize()

TOKEN_ARRAYS = ("hidden_states", "input_ids", "loss_mask")  # of a bfloat16 store; token_arrays(dtype) in general
SCALE_ARRAY = "hidden_states_scale"  # float8 stores: float32 [tokens, L], one scale per row (token x layer)
ARRAY_DTYPES = {"hidden_states": "bfloat16", "input_ids": "int32", "loss_mask": "uint8"}
# store.dtype -> the Zarr data type of each token array, in the order streams, records and checks go through them.
# store.dtype of a float8 store -> (its codes' encoding: the ml_dtypes / torch dtype name, the largest finite
# value of that encoding, to which a row's scale maps the row's largest |x|). store/fp8.py has the arithmetic.
FLOAT8_ENCODINGS = {"float8_e4m3": ("float8_e4m3fn", 448.0), "float8_e5m2": ("float8_e5m2", 57344.0)}
FLOAT8_ARRAYS = {"hidden_states": "uint8", SCALE_ARRAY: "float32", "input_ids": "int32", "loss_mask": "uint8"}
HIDDEN_DTYPES = {"bfloat16": ARRAY_DTYPES, **dict.fromkeys(FLOAT8_ENCODINGS, FLOAT8_ARRAYS)}
# Zarr data type -> numpy dtype of the raw bytes (bf16 is handled as its uint16 bits; float8 as its uint8 codes).
ZARR_NP = {"bfloat16": np.dtype("<u2"), "uint8": np.dtype("u1"), "int32": np.dtype("<i4"), "float32": np.dtype("<f4")}


def float8_attributes(encoding: str) -> dict:
    """The attributes of a float8 store's hidden_states array: what its uint8 codes mean (docs/reference/store-format.md)."""
    return {
        "eagle_batch": {
            "encoding": encoding,
            "scale_array": SCALE_ARRAY,
            "dequantize": f"value[t, l, h] = {encoding}(code[t, l, h]) * scale[t, l]",
        }
    }


EMPTY = np.uint64(2**64 - 1)  # ShardingCodec's marker for an absent inner chunk
CHUNK_TARGET_BYTES = 4 << 20  # store.chunk_tokens=0: inner chunks of about this many bytes of hidden states
BF16 = np.dtype(ml_dtypes.bfloat16)

LAYER_SEMANTICS = (
    "layer id k = residual stream (hidden state) after k decoder layers (the input of decoder layer k, vLLM's "
    "convention); id 0 = embeddings; id N = num_hidden_layers (the number of decoder layers, an attribute of "
    "its own) = last layer's output before the final norm. hidden_states[:, j] holds layer_ids[j]. See "
    "eagle_batch/capture/layers.py."
)


# --- bfloat16 as a Zarr v3 data type (zarr-extensions name "bfloat16", also read by TensorStore) -----


def _register_bfloat16() -> None:
    from dataclasses import dataclass as _dc

    from zarr.core.dtype import data_type_registry
    from zarr.core.dtype.npy.float import BaseFloat

    if "bfloat16" in data_type_registry.contents:
        return

    @_dc(frozen=True, kw_only=True)
    class BFloat16(BaseFloat):  # type: ignore[type-arg]
        """bfloat16 backed by ml_dtypes; stored little-endian, 2 bytes, fill value JSON as a float."""

        dtype_cls = type(BF16)
        _zarr_v3_name: ClassVar[str] = "bfloat16"
        _zarr_v2_names: ClassVar[tuple[str, ...]] = ()

        @classmethod
        def _check_native_dtype(cls, dtype) -> bool:  # ml_dtypes dtypes have no byte order variants
            return dtype == BF16

        def to_native_dtype(self):
            return BF16

        @property
        def item_size(self) -> int:
            return 2

    data_type_registry.register("bfloat16", BFloat16)


_register_bfloat16()


def array_dtypes(dtype: str) -> dict[str, str]:
    """The token arrays of a store of hidden-state `dtype` (store.dtype) and their Zarr data types."""
    try:
        return HIDDEN_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"store.dtype={dtype!r} is not supported; use one of {', '.join(HIDDEN_DTYPES)}.") from None


def token_arrays(dtype: str) -> tuple[str, ...]:
    return tuple(array_dtypes(dtype))


def format_version_for(dtype: str) -> int:
    """The format version a store of `dtype` is written as (FORMAT_VERSION's comment)."""
    return 1 if dtype == "bfloat16" else 2


def hidden_row_nbytes(spec) -> int:
    """Bytes of one token's hidden states (all layers) as a store of `spec` (a StoreSpec) stores them."""
    return spec.num_layers * spec.hidden_size * ZARR_NP[array_dtypes(spec.dtype)["hidden_states"]].itemsize


# --- codecs -------------------------------------------------------------------------------------

CODECS = ("blosc-zstd", "zstd", "none")


@dataclass(frozen=True)
class Codec:
    """One inner-chunk compressor: numcodecs object for speed, zarr metadata for the format."""

    name: str
    level: int = 1
    blocksize: int = 1 << 20

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise ValueError(f"store.codec={self.name!r} is not supported; use one of {', '.join(CODECS)}.")

    def numcodec(self):
        if self.name == "blosc-zstd":
            from numcodecs import Blosc

            # Byte shuffle puts the low-entropy bf16 exponent bytes of a block side by side, where zstd's
            # literal coding shrinks them; a large blocksize keeps more of them in one zstd stream.
            return Blosc(cname="zstd", clevel=self.level, shuffle=Blosc.SHUFFLE, blocksize=self.blocksize)
        if self.name == "zstd":
            from numcodecs import Zstd

            return Zstd(level=self.level)
        return None

    def zarr_codecs(self, itemsize: int) -> list[dict]:
        out: list[dict] = [{"name": "bytes", "configuration": {"endian": "little"}}]
        if self.name == "blosc-zstd":
            out.append(
                {
                    "name": "blosc",
                    "configuration": {
                        "typesize": itemsize,
                        "cname": "zstd",
                        "clevel": self.level,
                        "shuffle": "shuffle",
                        "blocksize": self.blocksize,
                    },
                }
            )
        elif self.name == "zstd":
            out.append({"name": "zstd", "configuration": {"level": self.level, "checksum": False}})
        return out

    @classmethod
    def from_zarr_codecs(cls, codecs: Sequence[dict]) -> "Codec":
        names = [c["name"] for c in codecs]
        if names == ["bytes"]:
            return cls("none")
        if names == ["bytes", "blosc"]:
            cfg = codecs[1]["configuration"]
            return cls("blosc-zstd", int(cfg["clevel"]), int(cfg.get("blocksize", 0)))
        if names == ["bytes", "zstd"]:
            return cls("zstd", int(codecs[1]["configuration"]["level"]))
        raise ValueError(f"inner codecs {names} are not ones eagle-batch writes")


def make_decoder(codec: Codec):
    """bytes -> raw bytes-like, for one inner chunk."""
    nc = codec.numcodec()
    if nc is None:
        return lambda b: b
    return nc.decode


# --- shard layout -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayLayout:
    """How one token array maps onto shard files."""

    name: str
    row_shape: tuple[int, ...]  # shape of one token's row (() for 1-D arrays)
    chunk_tokens: int
    shard_tokens: int
    codec: Codec
    data_type: str  # the Zarr data type (ZARR_NP)
    encoding: str = ""  # a float8 store's hidden_states: its codes' encoding (FLOAT8_ENCODINGS); else ""

    @property
    def np_dtype(self) -> np.dtype:
        return ZARR_NP[self.data_type]

    @property
    def chunks_per_shard(self) -> int:
        return self.shard_tokens // self.chunk_tokens

    @property
    def row_nbytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.np_dtype.itemsize

    def shard_key(self, k: int) -> str:
        return "c/" + "/".join([str(k)] + ["0"] * len(self.row_shape))

    def shard_path(self, store: Path, k: int) -> Path:
        return store / self.name / self.shard_key(k)

    def index_nbytes(self) -> int:
        return self.chunks_per_shard * 16 + 4

    def zarr_json(self, num_tokens: int) -> dict:
        dtype = self.data_type
        return {
            "shape": [num_tokens, *self.row_shape],
            "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [self.shard_tokens, *self.row_shape]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0.0 if dtype in ("bfloat16", "float32") else 0,
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [self.chunk_tokens, *self.row_shape],
                        "codecs": self.codec.zarr_codecs(self.np_dtype.itemsize),
                        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                        "index_location": "end",
                    },
                }
            ],
            "attributes": float8_attributes(self.encoding) if self.encoding else {},
            "zarr_format": 3,
            "node_type": "array",
            "storage_transformers": [],
        }

    @classmethod
    def from_zarr_json(cls, name: str, meta: dict) -> "ArrayLayout":
        shard_shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
        sharding = meta["codecs"][0]
        if sharding["name"] != "sharding_indexed":
            raise ValueError(f"{name}/zarr.json: expected a sharding_indexed codec, found {sharding['name']}")
        cfg = sharding["configuration"]
        return cls(
            name,
            tuple(int(x) for x in shard_shape[1:]),
            int(cfg["chunk_shape"][0]),
            int(shard_shape[0]),
            Codec.from_zarr_codecs(cfg["codecs"]),
            str(meta["data_type"]),
            str(meta.get("attributes", {}).get("eagle_batch", {}).get("encoding", "")),
        )


def auto_chunk_tokens(row_nbytes: int, shard_tokens: int) -> int:
    """store.chunk_tokens=0: the largest power of two <= 4 MiB of hidden-state rows that divides
    shard_tokens, within 16..1024 tokens (1024 keeps random reads of small models' samples cheap)."""
    want = max(16, min(1024, CHUNK_TARGET_BYTES // max(1, row_nbytes)))
    t = 1 << (int(want).bit_length() - 1)
    while t > 1 and shard_tokens % t:
        t >>= 1
    return t


def make_layouts(spec, chunk_tokens: int, shard_tokens: int, codec: Codec) -> dict[str, ArrayLayout]:
    """The token arrays' layouts for a store holding `spec` (a StoreSpec)."""
    L = spec.num_layers
    rows = {"hidden_states": (L, spec.hidden_size), SCALE_ARRAY: (L,), "input_ids": (), "loss_mask": ()}
    encoding = FLOAT8_ENCODINGS[spec.dtype][0] if spec.dtype in FLOAT8_ENCODINGS else ""
    return {
        n: ArrayLayout(n, rows[n], chunk_tokens, shard_tokens, codec, t, encoding if n == "hidden_states" else "")
        for n, t in array_dtypes(spec.dtype).items()
    }


# --- reading a store's metadata -------------------------------------------------------------------


def task_stores(run: Path) -> list[Path]:
    """The task store folders of a run directory (RUN/stores/*.zarr), sorted; none when RUN/stores is absent.
    One directory read: a directory entry carries its type, so no stat per store (on a parallel file system
    each stat is a round trip to the metadata server)."""
    root = Path(run) / "stores"
    try:
        with os.scandir(root) as it:
            names = sorted(e.name for e in it if e.name.endswith(".zarr") and e.is_dir())  # str sorts fast; Path slow
        return [root / name for name in names]
    except (FileNotFoundError, NotADirectoryError):
        return []


def load_json(p: Path, what: str) -> Any:
    """A JSON file of a store; missing or invalid, a StoreError that names it and `what` it is."""
    try:
        return json.loads(p.read_bytes())
    except FileNotFoundError:
        raise StoreError(f"{p} is missing: {what}") from None
    except ValueError as e:
        raise StoreCorruptError(f"{p} is not valid JSON ({e}): {what}") from None


def read_attrs(store: str | os.PathLike) -> dict:
    p = Path(store) / "zarr.json"
    meta = load_json(p, "the store's root group metadata; is this an eagle-batch task store?")
    attrs = meta.get("attributes", {}).get("eagle_batch")
    if not attrs:
        raise StoreError(f"{p} has no 'eagle_batch' attributes; not an eagle-batch task store")
    if int(attrs.get("format_version", 1)) > FORMAT_VERSION:
        raise StoreError(
            f"{p}: format_version {attrs['format_version']} is newer than this eagle-batch reads "
            f"({FORMAT_VERSION}); upgrade eagle-batch to read it."
        )
    problem = seal_problem(attrs)
    if problem:
        raise StoreCorruptError(
            f"{p}: the store's attributes (layer ids, hidden size, model) are damaged: {problem}. Delete "
            f"{Path(store)} and run `eagle-batch resume RUN` to extract its task again."
        )
    return attrs


def read_layouts(store: str | os.PathLike, dtype: str, metas: dict | None = None) -> dict[str, ArrayLayout]:
    """The token arrays' layouts of a store of hidden-state `dtype`, from `metas` (consolidated) or the files."""
    out = {}
    for name in token_arrays(dtype):
        meta = metas[name] if metas else load_json(Path(store) / name / "zarr.json", f"metadata of array {name}")
        out[name] = ArrayLayout.from_zarr_json(name, meta)
    return out

"""On-disk format of a task store: names, the bfloat16 Zarr data type, codecs, and the shard encoding.

A task store is a Zarr v3 group. Token-major arrays (`hidden_states [T, L, H]`, `input_ids [T]`,
`loss_mask [T]`) share one token grid: `chunk_tokens`-row inner chunks inside `shard_tokens`-row shards
(ShardingCodec, index at the end, index codecs bytes + crc32c). We encode shard files ourselves (so a
whole shard is written once, fsynced and renamed, and compression runs on our own threads) in exactly
the layout zarr's ShardingCodec reads; tests check that plain `zarr.open_array` reads them back.
See docs/format.md for the full specification.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import crc32c
import ml_dtypes
import numpy as np

FORMAT_NAME = "eagle-batch-task-store"
FORMAT_VERSION = 1
PROGRESS_NAME = "progress.json"  # the committed record; the only thing readers trust
COMPLETE_NAME = "complete"  # written last by finalize()
LOCK_NAME = ".lock"
PARTIAL_SUFFIX = ".partial"

TOKEN_ARRAYS = ("hidden_states", "input_ids", "loss_mask")
ARRAY_DTYPES = {"hidden_states": "bfloat16", "input_ids": "int32", "loss_mask": "uint8"}
# Storage dtype of each token array as numpy sees the raw bytes (bf16 is handled as its uint16 bits).
STORAGE_NP = {"hidden_states": np.dtype("<u2"), "input_ids": np.dtype("<i4"), "loss_mask": np.dtype("u1")}

EMPTY = np.uint64(2**64 - 1)  # ShardingCodec's marker for an absent inner chunk
BF16 = np.dtype(ml_dtypes.bfloat16)

LAYER_SEMANTICS = (
    "layer id k = residual stream (hidden state) after k decoder layers; id 0 = embeddings; id N (the "
    "number of decoder layers) = last layer's output before the final norm. hidden_states[:, j] holds "
    "layer_ids[j]. See eagle_batch/capture/layers.py."
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

            # Byte shuffle + a large blocksize keeps bf16 exponent bytes together (FINDINGS section 4).
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

    @property
    def np_dtype(self) -> np.dtype:
        return STORAGE_NP[self.name]

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
        dtype = ARRAY_DTYPES[self.name]
        return {
            "shape": [num_tokens, *self.row_shape],
            "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [self.shard_tokens, *self.row_shape]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0.0 if dtype == "bfloat16" else 0,
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
            "attributes": {},
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
        )


def encode_index(offsets_nbytes: np.ndarray) -> bytes:
    """[n, 2] uint64 (offset, nbytes) -> index bytes + crc32c, as ShardingCodec's index_codecs write it."""
    raw = np.ascontiguousarray(offsets_nbytes, dtype="<u8").tobytes()
    return raw + np.uint32(crc32c.crc32c(raw)).astype("<u4").tobytes()


def decode_index(buf: bytes, n_chunks: int, where: str) -> np.ndarray:
    raw, crc = buf[:-4], int(np.frombuffer(buf[-4:], "<u4")[0])
    if len(raw) != n_chunks * 16 or crc32c.crc32c(raw) != crc:
        raise ShardError(f"{where}: shard index is damaged (checksum mismatch or wrong size)")
    return np.frombuffer(raw, "<u8").reshape(n_chunks, 2)


class ShardError(ValueError):
    """A shard file that cannot be decoded (its path is in the message)."""


# --- durable file operations --------------------------------------------------------------------


def committed_samples(store: Path) -> int:
    """Samples in a task store's committed record (0 when it has none yet or cannot be read)."""
    try:
        return int(json.loads((Path(store) / PROGRESS_NAME).read_bytes())["num_samples"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def partial_name(path: Path) -> Path:
    # Same suffix as zarr's LocalStore temporaries, so one cleanup rule removes both.
    return path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")


_IOV_MAX = 1024


def _write_all(fd: int, views: list[memoryview]) -> None:
    """All of `views`, in order, with as few system calls as the kernel allows (writev): each call drops the
    GIL once, not once per piece, which matters with many busy threads in one process."""
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i : i + _IOV_MAX])
        while n:
            if n >= len(views[i]):
                n -= len(views[i])
                i += 1
            else:
                views[i] = views[i][n:]
                n = 0


def write_atomic(path: Path, pieces: Sequence[bytes | memoryview], fsync: bool = True, sync_dir: bool = True) -> None:
    """Write `pieces` to `path` via a `.partial` file and rename; with fsync, durable on return.

    sync_dir=False leaves the rename's directory entry to the caller's fsync_dir (batched per commit)."""
    tmp = partial_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        _write_all(fd, [mv for mv in (memoryview(p).cast("B") for p in pieces) if len(mv)])
        if fsync:
            os.fsync(fd)
    except BaseException as e:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space_error(path, e) from e
        raise
    os.close(fd)
    os.replace(tmp, path)
    if fsync and sync_dir:
        fsync_dir(path.parent)


def no_space_error(path: Path, e: OSError):
    """A full disk or quota as a StoreError that names the store and what to do (a bare ENOSPC names neither)."""
    from .spec import StoreError

    store = next((p for p in (path, *path.parents) if p.suffix == ".zarr"), path.parent)
    what = "quota exceeded" if e.errno == errno.EDQUOT else "no space left on device"
    return StoreError(
        f"{store}: {what} while writing {path.relative_to(store) if store in path.parents else path}. "
        "Everything committed before is intact (this write was not committed). Free space on that "
        f"file system (`df -h {store.parent}`) or raise the quota, then resume the task "
        "(`eagle-batch resume RUN`): it continues from its last commit."
    )


def write_json_atomic(path: Path, obj, fsync: bool = True) -> None:
    write_atomic(path, [json.dumps(obj, separators=(",", ":")).encode()], fsync=fsync)


def makedirs_durable(path: Path, fsync: bool = True, defer: set | None = None) -> None:
    """mkdir -p that fsyncs the parent of every directory it creates (so the new entries survive);
    with `defer`, adds those parents to the set instead, for one fsync each at the next commit."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            pass
        if defer is not None:
            defer.add(d.parent)
        elif fsync:
            fsync_dir(d.parent)

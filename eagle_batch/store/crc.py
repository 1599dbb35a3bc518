"""crc32c of a concatenation from the crc32c of its parts (zlib's crc32_combine, for the Castagnoli polynomial).

The store records the crc32c of each shard's raw rows. Chunks are checksummed by the compression threads
as they encode them, in any order; the shard's crc is then combined from the chunk crcs in row order
without touching the rows again: crc(A + B) = x^(8 * len(B)) * crc(A) + crc(B) over GF(2) mod P.

Sealed JSON (`sealed`, `seal_problem`): the store's metadata files (the committed record, the group
attributes, the aggregate index) carry the crc32c of their own parsed content, so a reader refuses a damaged
one instead of trusting a changed sample id, length or layer id.
"""

from __future__ import annotations

from functools import lru_cache

_POLY = 0x82F63B78  # crc32c, bit-reflected
_X0 = 1 << 31  # the polynomial "1" in reflected order


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the crc polynomial (reflected bit order)."""
    p = 0
    m = _X0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table, p = [], _X0 >> 1  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return table


_X2N = _x2n_table()  # x^(2^k) mod P


@lru_cache(maxsize=64)
def _shift(nbytes: int) -> int:
    """x^(8 * nbytes) mod P: the operator that moves a crc past `nbytes` appended bytes."""
    p, k, n = _X0, 3, nbytes
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32c_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """crc32c(A + B) given crc32c(A), crc32c(B) and len(B) in bytes."""
    if len_b <= 0:
        return crc_a
    return _multmodp(_shift(len_b), crc_a) ^ crc_b


# --- sealed JSON: a metadata file that carries the crc32c of its own content -----------------------

SEAL_KEY = "content_crc32c"


def json_crc32c(obj: dict) -> int:
    """crc32c of `obj` (less its SEAL_KEY) as canonical JSON (sorted keys, no spaces): the same for every
    serialization of the same content, so a reader can check it after parsing the file."""
    import json

    import crc32c

    body = {k: v for k, v in obj.items() if k != SEAL_KEY}
    return crc32c.crc32c(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def sealed(obj: dict) -> dict:
    """`obj` with SEAL_KEY set to the crc32c of the rest (written into a store's JSON files)."""
    return {**obj, SEAL_KEY: json_crc32c(obj)}


def seal_problem(obj: dict, known_keys: frozenset[str] | None = None) -> str | None:
    """What is wrong with a sealed JSON object, or None. An object without a seal is one written before
    seals existed: accepted when its keys are `known_keys` or a subset (a flipped byte in the seal's own key
    name leaves an unknown key behind)."""
    if SEAL_KEY in obj:
        if obj[SEAL_KEY] != json_crc32c(obj):
            return "its content differs from its crc32c (damaged after it was written)"
        return None
    if known_keys is not None:
        unknown = sorted(set(obj) - known_keys)
        if unknown:
            return f"it has no checksum and unknown keys {unknown} (damaged after it was written)"
    return None

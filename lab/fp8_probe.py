"""Float8 scale granularity on real states: one scale per row (token x layer) against one per block of channels.

    PYTHONPATH=. python lab/fp8_probe.py [POOL_ROWS]

Takes `bench store`'s pool of real SmolLM2-135M states (eagle_batch/bench/store.py `real_state_pool`, cached
under $EAGLE_BATCH_CACHE/bench; default 256 rows) and cuts it back into the model's own token rows: [tokens,
4 layers, 576]. For each granularity (`row`: 576 channels share a scale, what the store does; `block192`,
`block64`, `block32`: that many channels share one, like DeepSeek-V3's 128-channel activation blocks or the
MX formats' 32; 128 does not divide 576) it prints one
JSON line: per layer the error of the dequantized states against bf16 (eagle_batch/bench/fp8_error.py's
metrics, whole rows for cosine and L2, the block's own scale for the normal range), and the bytes per token:
codes compressed as the store compresses them (entropy-only blosc frames, typesize 1, 4 MiB chunks) plus the
float32 scales, which do not compress (kept raw in the count), and `codes_ratio_bound`, 8 bits over the codes'
order-0 entropy (what any coder of independent bytes can reach at most), and `codes_ratio_channel_context`, what
a coder with per-(layer, channel) statistics reaches on held-out rows; the first line has bf16's bytes per token,
raw and compressed the same way.
"""

import json
import sys

import numpy as np

from eagle_batch.bench.fp8_error import METRICS, row_errors
from eagle_batch.bench.store import LAYER_IDS, NATIVE, WIDE, real_state_pool
from eagle_batch.store.encoder import ChunkEncoder
from eagle_batch.store.format import BF16, Codec
from eagle_batch.store.fp8 import E4M3, E5M2, Float8, bf16_to_f32


def quantize_blocks(x: np.ndarray, block: int, f8: Float8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [N, L, H] -> (codes uint8 [N, L, H], scales [N, L, H // block], dequantized bf16 as float32)."""
    n, L, H = x.shape
    xb = x.reshape(n, L, H // block, block)
    scales = np.abs(xb).max(-1) / np.float32(f8.max)
    q = np.clip(xb / np.where(scales > 0, scales, np.float32(1))[..., None], -f8.max, f8.max).astype(f8.np_dtype)
    d = (q.astype(np.float32) * scales[..., None]).astype(BF16).astype(np.float32)
    return q.view(np.uint8).reshape(n, L, H), scales, d.reshape(n, L, H)


def entropy_bits(codes: np.ndarray) -> float:
    """Order-0 entropy of uint8 codes, bits per code."""
    p = np.bincount(codes.reshape(-1), minlength=256) / codes.size
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def channel_context_bits(codes: np.ndarray) -> float:
    """Bits per code of a coder whose model is each (layer, channel)'s own code frequencies, learned on the
    first half of the token rows and charged on the second (add-half smoothing): what a context of the
    channel can give over the order-0 bound, without the in-sample optimism of an entropy per context."""
    n, L, H = codes.shape
    ctx = np.broadcast_to(np.arange(L * H).reshape(L, H), codes.shape)
    half = n // 2
    counts = np.full((L * H, 256), 0.5)
    np.add.at(counts, (ctx[:half].reshape(-1), codes[:half].reshape(-1)), 1)
    prob = counts / counts.sum(1, keepdims=True)
    return float(-np.log2(prob[ctx[half:].reshape(-1), codes[half:].reshape(-1)]).mean())


def stored_bytes(values: np.ndarray) -> int:
    """Bytes of `values` compressed as the store compresses hidden states, in chunks of 4 MiB."""
    enc = ChunkEncoder(Codec("blosc-zstd"), values.dtype.itemsize, entropy_only=True)
    flat = values.reshape(-1)
    step = (4 << 20) // values.dtype.itemsize
    return sum(len(enc.encode(np.ascontiguousarray(flat[i : i + step]), None)) for i in range(0, flat.size, step))


def main() -> None:
    pool, info = real_state_pool(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
    per = WIDE // NATIVE
    tokens = pool[:, :, : per * NATIVE].reshape(len(pool), len(LAYER_IDS), per, NATIVE).transpose(0, 2, 1, 3)
    bits = np.ascontiguousarray(tokens.reshape(-1, len(LAYER_IDS), NATIVE))
    x = bf16_to_f32(bits)
    n = len(x)
    bf16 = {"bf16_bytes_per_token": bits[0].nbytes, "bf16_stored_bytes_per_token": round(stored_bytes(bits) / n, 1)}
    print(json.dumps({"states": info, "token_rows": n, **bf16}))
    grid = [("row", NATIVE, E4M3), ("block192", 192, E4M3), ("block64", 64, E4M3), ("block32", 32, E4M3)]
    for name, block, f8 in [*grid, ("row", NATIVE, E5M2)]:
        codes, scales, d = quantize_blocks(x, block, f8)
        normal_min = np.repeat(scales * f8.smallest_normal, block, axis=-1)  # [N, L, H]: each element's block scale
        per_layer = [row_errors(x[:, j], d[:, j], normal_min[:, j]) for j in range(len(LAYER_IDS))]
        code_bytes = stored_bytes(codes)
        out = {
            "encoding": f8.encoding,
            "granularity": name,
            "channels_per_scale": block,
            "bytes_per_token": round((code_bytes + scales.nbytes) / n, 1),
            "codes_ratio": round(codes.nbytes / code_bytes, 4),
            # The most any coder of independent bytes can give: 8 / (order-0 entropy of the codes).
            "codes_ratio_bound": round(8 / entropy_bits(codes), 4),
            # The same with each (layer, channel)'s own statistics (held-out half): a context coder's reach.
            "codes_ratio_channel_context": round(8 / channel_context_bits(codes), 4),
            "scale_bytes_per_token": scales.nbytes // n,
            "layer_ids": LAYER_IDS,
            **{m: [round(p[m], 6) for p in per_layer] for m in METRICS},
        }
        print(json.dumps(out))


if __name__ == "__main__":
    main()

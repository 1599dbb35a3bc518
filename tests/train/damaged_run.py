"""A small committed, aggregated run built with the real store writer (no engine): for the tests that damage
its bytes and check that every reader refuses or names the damage (test_damaged_data.py, test_flip_campaign.py).

`build_run(tmp)` -> (run_dir, train config file): RUN/stores/task-0000{0,1}.zarr (tiny states, several inner
chunks and shards per array), RUN/dataset.json, a fake target and a CPU training config over RUN.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from conftest import TINY, TINY_LAYERS, write_fake_target
from helpers import random_samples

# Small chunks and shards: a sample spans several, so damage anywhere is met by some sample.
STORE = {"chunk_tokens": 16, "shard_tokens": 64, "fsync": False}


def write_store(path: Path, n: int, seed: int, salt: int = 0) -> None:
    """A finished task store of `n` samples with ids t{seed}-r{i}; `salt` changes the states, not the ids."""
    from eagle_batch.config.schema import StoreConfig
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    spec = StoreSpec(layer_ids=TINY_LAYERS, hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"])
    w = TaskStoreWriter.open(path, spec, StoreConfig(**STORE))
    for s in random_samples(n, TINY_LAYERS, TINY["hidden"], TINY["vocab"], seed=seed):
        hs = s["hidden_states"] if not salt else s["hidden_states"] * (1 + salt / 100)
        w.append(f"t{seed}-{s['sample_id']}", s["input_ids"].numpy().astype(np.int32), s["loss_mask"].numpy(), hs)
    w.commit()
    w.finalize()
    w.close()


def build_run(tmp: Path, samples_per_task: int = 12) -> tuple[Path, Path]:
    from eagle_batch.store import aggregate

    target = write_fake_target(tmp / "target")
    run = tmp / "run"
    for t in range(2):
        write_store(run / "stores" / f"task-{t:05d}.zarr", samples_per_task, seed=t + 1)
    aggregate(run, fsync=False)
    conf = tmp / "train.yaml"
    train = {"steps": 3, "batch_tokens": 256, "draft_vocab_size": 64, "ttt_steps": 2, "precision": "fp32"}
    # default max_restarts: `train --local` runs the trainer in a child rank, whose data loader has a worker
    train |= {"num_workers": 1, "prefetch_factor": 2, "tensorboard": False, "log_every": 1}
    conf.write_text(json.dumps({"run_dir": str(run), "model": {"path": str(target)}, "train": train}))
    return run, conf


def chunk_span(store: Path, array: str, shard: int, chunk: int) -> tuple[int, int]:
    """(offset, nbytes) of an inner chunk inside its shard file, from the shard's index."""
    from eagle_batch.store.format import read_attrs, read_layouts
    from eagle_batch.store.shard_codec import ShardDecoder
    from eagle_batch.store.spec import StoreSpec

    lay = read_layouts(store, StoreSpec.from_attributes(read_attrs(store)).dtype)[array]
    data = lay.shard_path(store, shard).read_bytes()
    off, nb = ShardDecoder(lay).index(data, "")[chunk]
    return int(off), int(nb)


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    """XOR one byte of a file in place (a bit flipped by a bad disk, cache or a stray dd)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))

"""docs/reference/store-format.md's Python blocks, run as a third-party reader would: in a process that never imports
eagle-batch, against a store the writer made; what they read must be what the reader reads. Also the
page's claim that `zarr.open_group` fails on a complete store without the bfloat16 registration, and the
call it gives instead."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from eagle_batch.config import StoreConfig, tokenizer_sha256
from eagle_batch.store import StoreSpec, TaskStoreWriter, open_dataset

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reference" / "store-format.md"
LAYERS, N, H = [2, 3, 4, 6], 6, 24

# Runs each block in one namespace; after each, keeps the variables the test compares (later blocks reuse
# names such as `offsets` and `hs`).
DRIVER = r"""
import json, sys
import numpy as np
blocks = json.load(open(sys.argv[1]))
ns, seen = {"__name__": "__main__"}, {}
for k, code in enumerate(blocks):
    exec(compile(code, f"docs/reference/store-format.md block {k}", "exec"), ns)
    for name in ("ids", "mask", "hs", "last", "pairs", "offsets", "sample_ids", "attrs"):
        if name in ns and f"{name}@{k}" not in seen:
            seen[f"{name}@{k}"] = ns[name]
assert not [m for m in sys.modules if m.split(".")[0] == "eagle_batch"], "a doc block imported eagle-batch"
out = {}
for key, v in seen.items():
    if isinstance(v, np.ndarray) and v.dtype.name == "bfloat16":
        v = v.view(np.uint16)
    out[key] = v.tolist() if isinstance(v, np.ndarray) else v
out["tokenizer_sha256"] = ns["tokenizer_sha256"]("tok")
json.dump(out, open("doc_result.json", "w"))
"""


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _store(path: Path) -> None:
    g = np.random.default_rng(3)
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=H, model_name="m", num_hidden_layers=N, tokenizer="tok")
    w = TaskStoreWriter.open(path, spec, StoreConfig(chunk_tokens=16, shard_tokens=64, fsync=False))
    for i in range(6):
        t = int(g.integers(10, 80))
        f = g.standard_normal((t, len(LAYERS), H)).astype(np.float32)
        w.append(
            f"doc-{i}",
            g.integers(0, 1000, t).astype(np.int32),
            (g.random(t) < 0.5).astype(np.uint8),
            (f.view(np.uint32) >> 16).astype(np.uint16),
        )
    w.commit()
    w.finalize()
    w.close()


def _run(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # -I: isolated mode, so neither the repository nor PYTHONPATH puts eagle-batch on the path.
    return subprocess.run(
        [sys.executable, "-I", "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_format_doc_blocks_read_what_the_reader_reads(tmp_path):
    _store(tmp_path / "task-00000.zarr")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (tok / "tokenizer_config.json").write_text("{}")
    # The "FP8 hidden states" section's block reads a float8 store: tests/store/test_fp8.py runs it.
    blocks = python_blocks(DOC.read_text().split("\n## FP8 hidden states")[0])
    assert len(blocks) >= 4  # tokenizer identity, bfloat16, zarr reading, numpy + numcodecs
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    r = _run(DRIVER, tmp_path, str(tmp_path / "blocks.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((tmp_path / "doc_result.json").read_text())

    def first(name: str):  # the value a variable had after the first block that set it
        return min((int(k.split("@")[1]), v) for k, v in got.items() if k.split("@")[0] == name)[1]

    ds = open_dataset(tmp_path / "task-00000.zarr")
    x = ds.get_arrays(3)
    assert first("ids") == x["input_ids"].tolist() and first("mask") == x["loss_mask"].tolist()
    assert first("hs") == x["hidden_states"].tolist()  # the zarr block, sample 3, as bf16 bits
    assert first("last") == x["hidden_states"][:, LAYERS.index(N)].tolist()
    for key, v in got.items():  # every block that reads the index arrays (zarr; numpy + numcodecs)
        if key.startswith("sample_ids@"):
            assert v == [f"doc-{i}" for i in range(6)], key
        if key.startswith("offsets@"):
            assert v == ds.stores[0].offsets.tolist(), key
    assert first("attrs")["num_hidden_layers"] == N
    ids, mask = x["input_ids"], x["loss_mask"]
    assert first("pairs") == [[t, int(ids[t + 1])] for t in range(len(ids) - 1) if mask[t + 1]]
    numpy_hs = max((int(k.split("@")[1]), v) for k, v in got.items() if k.startswith("hs@"))[1]  # numpy block
    assert numpy_hs == x["hidden_states"].tolist()
    assert got["tokenizer_sha256"] == tokenizer_sha256(tok)


def test_open_group_needs_the_bfloat16_registration(tmp_path):
    _store(tmp_path / "task-00000.zarr")
    plain = _run("import zarr; zarr.open_group('task-00000.zarr', mode='r')", tmp_path)
    assert plain.returncode != 0 and "bfloat16" in plain.stderr
    alt = _run(
        "import zarr\n"
        "g = zarr.open_group('task-00000.zarr', mode='r', use_consolidated=False)\n"
        "print(len(g['input_ids'][:]), len(zarr.open_array('task-00000.zarr/loss_mask')[:]))",
        tmp_path,
    )
    assert alt.returncode == 0, alt.stderr[-2000:]
    n = open_dataset(tmp_path / "task-00000.zarr").stores[0].num_tokens
    assert alt.stdout.split() == [str(n), str(n)]
    msg = re.search(r"`(ValueError: [^`]*)`", DOC.read_text())
    assert msg and " ".join(msg.group(1).split()) in plain.stderr  # the page quotes zarr's error as it is


def test_lock_content_is_what_the_page_says(tmp_path):
    # While a writer holds the flock: one line of JSON naming it; once it closes: an empty file.
    spec = StoreSpec(layer_ids=LAYERS, hidden_size=H, num_hidden_layers=N)
    w = TaskStoreWriter.open(tmp_path / "s.zarr", spec, StoreConfig(fsync=False))
    held = json.loads((tmp_path / "s.zarr" / ".lock").read_text())
    assert sorted(held) == ["host", "pid", "since", "slurm_job"] and re.fullmatch(
        r"\d{4}-\d\d-\d\dT[\d:]{8}Z", held["since"]
    )
    w.close()
    assert (tmp_path / "s.zarr" / ".lock").read_bytes() == b""

"""import-data: a speculators folder -> a task store with the same samples; a rerun resumes; bad input is
named."""

from __future__ import annotations

import json

import numpy as np
import torch
from interop_testlib import LAYERS, N_LAYERS
from safetensors.torch import save_file

from eagle_batch.cli import main
from eagle_batch.store import open_dataset, verify


def test_import_round_trip_and_resume(tmp_path, store, samples, capsys):
    src = tmp_path / "spec"
    assert main(["export-data", str(store), str(src), "--format", "speculators", "--no-fsync"]) == 0
    dest = tmp_path / "imported" / "task-00000.zarr"
    args = ["import-data", str(src), str(dest), "--aux-layer-ids", "2", "3", "4", "--num-hidden-layers", "6", "--json"]
    capsys.readouterr()
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == {"store": str(dest), "added": 12, "skipped": 0, "layer_ids": LAYERS}
    assert verify(dest) == []
    ds = open_dataset(dest)
    assert ds.spec.num_hidden_layers == N_LAYERS and ds.layer_ids == LAYERS
    for i, (sid, ids, mask, hs) in enumerate(samples):
        x = ds.get_arrays(i)
        assert x["sample_id"] == sid
        assert np.array_equal(x["input_ids"], ids) and np.array_equal(x["loss_mask"], mask)
        assert np.array_equal(x["hidden_states"], hs)
    assert main(args) == 0  # complete: every sample already committed
    assert json.loads(capsys.readouterr().out)["skipped"] == 12


def test_import_names_the_bad_file(tmp_path, store, capsys):
    src = tmp_path / "spec"
    assert main(["export-data", str(store), str(src), "--format", "speculators", "--no-fsync"]) == 0
    f = src / "hidden_states" / "hs_2.safetensors"
    save_file(
        {"hidden_states": torch.zeros(3, 2, 32, dtype=torch.bfloat16), "token_ids": torch.zeros(3, dtype=torch.long)},
        str(f),
    )
    dest = tmp_path / "imported" / "task-00000.zarr"
    rc = main(["import-data", str(src), str(dest), "--aux-layer-ids", "2", "3", "4", "--num-hidden-layers", "6"])
    assert rc == 2
    err = capsys.readouterr().err
    assert str(f) in err and "is not [T, 4, 32]" in err
    assert verify(dest) == []  # the failed import left a consistent store: what it committed, nothing half
    rc = main(["import-data", str(src), str(dest), "--aux-layer-ids", "4", "3", "--num-hidden-layers", "6"])
    assert rc == 2 and "ascending" in capsys.readouterr().err

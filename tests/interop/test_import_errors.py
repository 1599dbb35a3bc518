"""import-data and export-data on wrong paths and options: one line naming what is wrong, checked before the
destination is created, so that the corrected rerun works; a store with committed samples is never replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from interop_testlib import LAYERS

from eagle_batch.cli import main
from eagle_batch.config import StoreConfig
from eagle_batch.store import StoreSpec, TaskStoreWriter, open_dataset, verify

AUX = ["--aux-layer-ids", "2", "3", "4", "--num-hidden-layers", "6"]


def _run(argv, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.out, out.err


@pytest.fixture
def src(tmp_path, store, capsys) -> Path:
    """A speculators data folder of the 12 samples of the `store` fixture."""
    out = tmp_path / "spec"
    assert _run(["export-data", store, out, "--format", "speculators", "--no-fsync"], capsys)[0] == 0
    return out


def test_missing_or_unrelated_src_is_named_before_any_store(tmp_path, capsys):
    dest = tmp_path / "dest" / "task-00000.zarr"
    rc, _, err = _run(["import-data", tmp_path / "nope", dest, *AUX], capsys)
    assert rc == 2 and f"SRC {tmp_path / 'nope'} does not exist" in err and "hs_0" not in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    rc, _, err = _run(["import-data", other, dest, *AUX], capsys)
    assert rc == 2 and "is not a speculators data folder: no state.json" in err and "and no hidden_states/" in err
    assert not dest.exists() and not dest.parent.exists()


def test_src_without_hidden_states_says_to_generate_them(src, tmp_path, capsys):
    for f in (src / "hidden_states").iterdir():
        f.unlink()
    dest = tmp_path / "dest.zarr"
    rc, _, err = _run(["import-data", src, dest, *AUX], capsys)
    assert rc == 2 and "has no hs_0.safetensors" in err and "generate-offline-data" in err
    assert not dest.exists()


def test_wrong_aux_count_creates_nothing_and_the_corrected_rerun_works(src, tmp_path, capsys):
    dest = tmp_path / "imported" / "task-00000.zarr"
    rc, _, err = _run(["import-data", src, dest, "--aux-layer-ids", "2", "4", "--num-hidden-layers", "6"], capsys)
    assert rc == 2
    assert "hs_0.safetensors: hidden_states" in err and "give 3 ids to --aux-layer-ids" in err
    assert not dest.exists()  # validated before the store was created
    rc, out, err = _run(["import-data", src, dest, *AUX, "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["added"] == 12 and verify(dest) == []


def test_an_empty_store_of_another_spec_is_replaced_one_with_samples_is_not(src, tmp_path, capsys):
    dest = tmp_path / "imported" / "task-00000.zarr"
    other = StoreSpec(layer_ids=[1, 3, 6], hidden_size=32, num_hidden_layers=6, extra={"imported_from": "speculators"})
    TaskStoreWriter.open(dest, other, StoreConfig(fsync=False)).close()  # an older attempt: nothing committed
    rc, out, err = _run(["import-data", src, dest, *AUX], capsys)
    assert rc == 0, err
    assert "no committed sample; it was replaced" in err and "12 samples added" in out
    assert open_dataset(dest).layer_ids == LAYERS

    # Now it holds 12 committed samples: another spec is refused and the samples stay.
    rc, _, err = _run(["import-data", src, dest, "--aux-layer-ids", "2", "3", "4", "--num-hidden-layers", "7"], capsys)
    assert rc == 2 and "written for a different model/config" in err
    assert len(open_dataset(dest)) == 12 and verify(dest) == []


def test_import_into_a_file_path(src, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, _, err = _run(["import-data", src, afile, *AUX], capsys)
    assert rc == 2 and f"STORE {afile} is a file" in err and "Not a directory" not in err
    rc, _, err = _run(["import-data", src, afile / "task-00000.zarr", *AUX], capsys)
    assert rc == 2 and f"{afile} is a file, not a folder" in err
    assert afile.read_text() == "x"


def test_export_into_a_file_path(store, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, _, err = _run(["export-data", store, afile, "--format", "speculators"], capsys)
    assert rc == 2 and f"OUT {afile} is a file" in err and "File exists" not in err
    rc, _, err = _run(["export-data", store, afile / "out", "--format", "speculators"], capsys)
    assert rc == 2 and f"{afile} is a file, not a folder" in err
    assert afile.read_text() == "x"

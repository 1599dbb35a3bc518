"""aggregate, verify and open_dataset on runs that are damaged, unfinished or not extracted yet: one line that
names the file or folder and the command to run; an existing dataset.json is never replaced by nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from store_testlib import HIDDEN, LAYERS
from test_aggregate import build_run

from eagle_batch.cli import main
from eagle_batch.store import StoreError, StoreSpec, aggregate, open_dataset, verify

SPEC = StoreSpec(layer_ids=LAYERS, hidden_size=HIDDEN, model_name="synthetic", config_hash="h")


def _run(argv, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.out, out.err


@pytest.fixture
def run(tmp_path) -> Path:
    """A run with two complete stores of 3 samples each, aggregated: dataset.json lists 6 samples."""
    build_run(tmp_path, SPEC, 2, 3)
    aggregate(tmp_path, fsync=False)
    return tmp_path


def test_damaged_marker_names_it_and_leaves_the_index(run, capsys):
    """The `complete` marker holds what aggregate indexes (one read per store): damaged, it is named."""
    before = (run / "dataset.json").read_bytes()
    bad = run / "stores" / "task-00001.zarr" / "complete"
    bad.write_text('{"num_samples": 3, "attri')
    rc, out, err = _run(["aggregate", str(run), "--no-progress"], capsys)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and f"{bad} is damaged (not valid JSON" in err
    assert f"eagle-batch verify {run}" in err and f"eagle-batch resume {run}" in err
    assert (run / "dataset.json").read_bytes() == before


def test_damaged_store_zarr_json_names_it_and_leaves_the_index(run, capsys):
    """A store finalized by an eagle-batch whose marker holds only the counts: aggregate reads its zarr.json."""
    before = (run / "dataset.json").read_bytes()
    marker = run / "stores" / "task-00001.zarr" / "complete"
    # An older marker: no summary, no record digest, no seal.
    dropped = ("attributes", "arrays", "lengths", "record", "content_crc32c")
    old = {k: v for k, v in json.loads(marker.read_text()).items() if k not in dropped}
    marker.write_text(json.dumps(old))
    bad = run / "stores" / "task-00001.zarr" / "zarr.json"
    bad.write_text('{"zarr_format": 3, "attri')
    rc, out, err = _run(["aggregate", str(run), "--no-progress"], capsys)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and f"{bad} is damaged (not valid JSON" in err
    assert f"eagle-batch verify {run}" in err and f"eagle-batch resume {run}" in err
    assert (run / "dataset.json").read_bytes() == before


def test_no_complete_store_writes_nothing_and_keeps_the_index(run, capsys):
    before = (run / "dataset.json").read_bytes()
    for s in (run / "stores").iterdir():  # both stores unfinished again (a repair in progress)
        (s / "complete").unlink()
    rc, out, err = _run(["aggregate", str(run), "--no-progress"], capsys)
    assert rc == 2 and out == ""  # no success line
    assert f"no complete task store under {run / 'stores'}" in err and "6 samples committed" in err
    assert f"`eagle-batch resume {run}`" in err and "was left as it was" in err
    assert (run / "dataset.json").read_bytes() == before


def test_empty_stores_folder_says_nothing_was_extracted(run, capsys):
    before = (run / "dataset.json").read_bytes()
    shutil.rmtree(run / "stores")
    (run / "stores").mkdir()
    rc, out, err = _run(["aggregate", str(run), "--no-progress"], capsys)
    assert rc == 2 and out == ""
    assert "holds no task store: nothing has been extracted yet" in err and "eagle-batch extract CONFIG" in err
    assert (run / "dataset.json").read_bytes() == before


def test_complete_stores_without_samples_write_no_index(tmp_path, capsys):
    build_run(tmp_path, SPEC, 2, 0)
    rc, out, err = _run(["aggregate", str(tmp_path), "--no-progress"], capsys)
    assert rc == 2 and out == "" and "hold no samples: nothing was extracted" in err
    assert not (tmp_path / "dataset.json").exists()


def test_fewer_samples_than_the_old_index_is_written_with_a_warning(run, capsys):
    (run / "stores" / "task-00001.zarr" / "complete").unlink()
    rc, out, err = _run(["aggregate", str(run), "--no-progress"], capsys)
    assert rc == 0 and "1 complete store(s), 3 samples" in out
    assert "listed 6 samples before, now 3" in err
    assert "stores/task-00001.zarr (3 samples) no longer complete (3 samples committed)" in err
    assert len(open_dataset(run)) == 3


def test_verify_on_a_prepared_run_says_to_extract(tmp_path, capsys):
    (tmp_path / "prepared").mkdir()
    (tmp_path / "config.yaml").write_text("run_dir: x\n")
    rc, out, err = _run(["verify", str(tmp_path), "--no-progress"], capsys)
    assert rc == 2 and out == ""
    assert f"{tmp_path} is a run directory with no task store yet (no stores/)" in err
    assert "eagle-batch extract CONFIG" in err and f"eagle-batch aggregate {tmp_path}" in err
    assert "neither" not in err


def test_verify_of_an_index_over_deleted_stores_says_so_once(run, capsys):
    shutil.rmtree(run / "stores")
    (run / "stores").mkdir()
    rc, out, err = _run(["verify", str(run), "--no-progress"], capsys)
    assert rc == 2 and out == ""
    assert "dataset.json lists 2 store(s) that are not there" in err and "problem(s)" not in err
    assert err.count("\n") == 1


def test_verify_names_a_listed_store_that_is_gone(run):
    shutil.rmtree(run / "stores" / "task-00001.zarr")
    problems = verify(run)
    assert len(problems) == 1 and problems[0].kind == "index"
    assert "the store does not exist" in problems[0].message and "eagle-batch resume" in problems[0].message


def test_reading_a_run_that_was_not_extracted_says_what_to_run(tmp_path, capsys):
    (tmp_path / "prepared").mkdir()
    with pytest.raises(
        StoreError, match=r"run directory with nothing extracted yet.*: run `eagle-batch extract CONFIG`"
    ):
        open_dataset(tmp_path)
    rc, _, err = _run(["export-data", str(tmp_path), str(tmp_path / "out"), "--format", "speculators"], capsys)
    assert rc == 2 and f"eagle-batch status {tmp_path}" in err and f"eagle-batch aggregate {tmp_path}" in err
    assert not (tmp_path / "out").exists()
    (tmp_path / "stores").mkdir()
    with pytest.raises(StoreError, match="stores/ holds no task store yet"):
        open_dataset(tmp_path)


def test_unrelated_folder_is_still_neither(tmp_path):
    with pytest.raises(StoreError, match="neither a task store .* give a run directory"):
        open_dataset(tmp_path)
    with pytest.raises(StoreError, match="does not exist"):
        verify(tmp_path / "nope")
    (tmp_path / "index.json").write_text(json.dumps({}))
    with pytest.raises(StoreError, match="neither a task store nor a run directory"):
        verify(tmp_path)

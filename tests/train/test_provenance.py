"""Derived data know what they were derived from: after a task store is extracted again (new bytes, same
sample ids), `verify` names the aggregate view, the trained draft and the export as stale, and export-data
into the earlier folder rewrites exactly the samples whose source changed."""

from __future__ import annotations

import json
import shutil

from cli_run import run_cli
from conftest import tiny_cfg
from damaged_run import build_run, write_store

from eagle_batch.store.provenance import SOURCES_NAME


def _done(out):
    return {
        json.loads(x)["id"]: json.loads(x)["src"] for x in (out / "eagle-batch-export.done").read_text().splitlines()
    }


def test_stale_outputs_are_named_and_export_rewrites_what_changed(tmp_path):
    from eagle_batch.train.trainer import train

    run, _ = build_run(tmp_path)
    r = train(tiny_cfg(run, tmp_path / "target", "train.steps=1"))
    draft = run / "train" / "draft" / "export"
    assert r["status"] == "done" and json.loads((draft / SOURCES_NAME).read_text())["stores"]
    out = tmp_path / "out"
    e = run_cli("export-data", run, out, "--format", "speculators", "--no-progress", "--json")
    assert e.returncode == 0, e.stderr
    before = _done(out)
    assert run_cli("verify", out).returncode == 0

    store = run / "stores" / "task-00000.zarr"  # extracted again: the same ids, other bytes
    shutil.rmtree(store)
    write_store(store, 12, seed=1, salt=7)

    v = run_cli("verify", run)
    assert v.returncode == 1 and "Traceback" not in v.stderr
    assert "stale" in v.stdout and f"eagle-batch aggregate {run}" in v.stdout
    assert f"{draft} is stale" in v.stdout and "eagle-batch train CONFIG" in v.stdout
    vo = run_cli("verify", out)
    assert vo.returncode == 1 and f"{out} is stale" in vo.stdout and str(store) in vo.stdout

    assert run_cli("aggregate", run, "--no-progress").returncode == 0
    again = run_cli("export-data", run, out, "--format", "speculators", "--no-progress", "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    changed = {sid for sid, src in _done(out).items() if before.get(sid) != src}
    assert summary["written"] == 12 and summary["skipped"] == 12
    assert changed == {sid for sid in before if sid.startswith("t1-")}  # task 0's samples, and only them
    assert run_cli("verify", out).returncode == 0

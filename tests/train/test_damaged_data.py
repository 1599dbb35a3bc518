"""One byte flipped in a committed hidden-state chunk: `verify`, `train --local` and `export-data`, run as a
user types them, each refuse or name the damage (exit code non-zero, no traceback); with the skip options
they leave out exactly the samples of the damaged chunk and say so."""

from __future__ import annotations

import json

from cli_run import run_cli
from damaged_run import build_run, chunk_span, flip

from eagle_batch.store import read_record
from eagle_batch.store.record import sample_bounds


def _damage_hidden_chunk(run):
    """Flip a byte inside chunk 1 of shard 0 of task 0's hidden states -> (store, ids of its samples)."""
    store = run / "stores" / "task-00000.zarr"
    off, nb = chunk_span(store, "hidden_states", 0, 1)
    flip(store / "hidden_states" / "c" / "0" / "0" / "0", off + nb // 2, 0x10)
    rec = read_record(store)
    bounds = sample_bounds(rec["lengths"])
    t0, t1 = 16, 32  # chunk 1 of shard 0 (chunk_tokens 16)
    ids = [rec["sample_ids"][i] for i in range(len(rec["lengths"])) if bounds[i] < t1 and bounds[i + 1] > t0]
    return store, ids


def _one_line_error(r, *needles):
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def test_flipped_hidden_state_byte_is_refused_by_every_reader(tmp_path):
    run, conf = build_run(tmp_path)
    store, ids = _damage_hidden_chunk(run)
    assert ids

    v = run_cli("verify", run)
    assert v.returncode == 1 and "Traceback" not in v.stderr
    assert "hidden_states shard 0" in v.stdout + v.stderr and ids[0] in v.stdout + v.stderr

    t = run_cli("train", conf, "--local", "--no-progress")
    _one_line_error(t, str(store), "hidden_states chunk 1 of shard 0", ids[0], f"eagle-batch resume {run} --repair")
    assert not (run / "train" / "draft" / "export").exists()

    e = run_cli("export-data", run, tmp_path / "out", "--format", "speculators", "--no-progress")
    _one_line_error(e, str(store), "hidden_states chunk 1 of shard 0", ids[0], "--repair")


def test_skip_options_leave_out_exactly_the_damaged_samples_and_name_them(tmp_path):
    run, conf = build_run(tmp_path)
    store, ids = _damage_hidden_chunk(run)

    t = run_cli("train", conf, "--local", "--no-progress", "train.on_damaged=skip")
    assert t.returncode == 0 and "Traceback" not in t.stderr, t.stderr
    skipped = sorted(
        {
            line.split("skipped damaged sample ")[1].split(":")[0]
            for line in t.stderr.splitlines()
            if "skipped damaged sample " in line
        }
    )
    assert set(skipped) <= set(ids) and skipped, t.stderr  # only samples of the damaged chunk, each named once
    assert f"skipped {len(skipped)} damaged sample(s) in all" in t.stderr
    assert (run / "train" / "draft" / "export" / "model.safetensors").is_file()

    out = tmp_path / "out"
    e = run_cli("export-data", run, out, "--format", "speculators", "--no-progress", "--on-damaged", "skip")
    _one_line_error(e, f"skipped {len(ids)} damaged sample(s) in all", "incomplete")
    named = {
        line.split("skipped damaged sample ")[1].split(":")[0]
        for line in e.stderr.splitlines()
        if "skipped damaged sample " in line
    }
    assert named == set(ids)
    assert not json.loads((out / "eagle-batch-export.json").read_text())["complete"]
    done = [json.loads(x)["id"] for x in (out / "eagle-batch-export.done").read_text().splitlines()]
    assert len(done) == 24 - len(ids) and not set(done) & set(ids)  # every other sample was written

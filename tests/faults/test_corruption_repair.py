"""Corruption of finished task stores of a real run: `eagle-batch verify RUN` names each damage, and
`eagle-batch resume RUN --repair` (local executor, the real ArrayTask in a new process) recomputes only
what the damage covers, ending with stores bit-identical to the uninterrupted run.

One run, five tasks (4 demo chats each, ~4 shards per array), one fault per task:
  0 flipped byte in a hidden_states shard     1 truncated input_ids shard     2 deleted hidden_states shard
  3 stray files only (a *.partial, a shard past the record)    4 a progress record pointing past the data
The store-level unit tests of each damage are tests/store/test_verify.py; the synthetic-work Slurm version
of `resume --repair` is in tests/slurm/test_slurm.py. This one runs the model, the CLI and the local executor.
"""

from __future__ import annotations

import json
import shutil

import faultlib as F
import numpy as np
import pytest

from eagle_batch.store.crc import sealed

N_TASKS = 5


@pytest.fixture(scope="module")
def reference5(faults_base, prepared):
    run = F.copy_run(prepared, faults_base / "ref5")
    F.split_plan(run, N_TASKS)
    for t in range(N_TASKS):
        code, _ = F.run_forked(run, t)
        assert code == 0, F.child_stderr(run, t)
    return run


def _bounds(store):
    r = json.loads((store / "progress.json").read_text())
    return np.concatenate([[0], np.cumsum(r["lengths"])]), r


def _first_sample_touching(store, shard, shard_tokens=F.STORE["shard_tokens"]):
    b, _ = _bounds(store)
    return int(np.searchsorted(b, shard * shard_tokens, side="right") - 1)


def corrupt(run):
    """Apply one fault per task; -> {task: samples expected to survive the repair}."""
    s = [F.store_of(run, t) for t in range(N_TASKS)]
    keep = {}
    f = s[0] / "hidden_states" / "c" / "1" / "0" / "0"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x40
    f.write_bytes(bytes(data))
    keep[0] = _first_sample_touching(s[0], 1)
    f = s[1] / "input_ids" / "c" / "1"
    f.write_bytes(f.read_bytes()[:-10])
    keep[1] = _first_sample_touching(s[1], 1)
    (s[2] / "hidden_states" / "c" / "2" / "0" / "0").unlink()
    keep[2] = _first_sample_touching(s[2], 2)
    (s[3] / "loss_mask" / "c" / "0.0123abcd.partial").write_bytes(b"half a shard")
    shutil.copy2(s[3] / "input_ids" / "c" / "0", s[3] / "input_ids" / "c" / "9")
    keep[3] = _bounds(s[3])[1]["num_samples"]
    p = s[4] / "progress.json"
    r = json.loads(p.read_text())
    r["lengths"][-1] += 40
    r["num_tokens"] += 40
    p.write_text(json.dumps(sealed(r)))  # a consistent record (sealed) that claims tokens the data lack
    keep[4] = r["num_samples"] - 1  # the last sample's claimed tokens are not in the data
    return keep


def test_verify_names_each_damage_and_resume_repair_recomputes_only_it(faults_base, reference5, capsys):
    run = F.copy_run(reference5, faults_base / "damaged", what=("config.yaml", "prepared", "stores", "state"))
    keep = corrupt(run)

    capsys.readouterr()
    rc = F.cli("verify", run)
    out = capsys.readouterr()
    assert rc == 1, out.err
    lines = out.out.splitlines()

    def named(task, *words):
        return any(f"task-{task:05d}.zarr" in ln and all(w in ln for w in words) for ln in lines)

    assert named(0, "hidden_states shard 1", "checksum", "covers samples"), out.out
    assert named(1, "input_ids shard 1", "truncated", "covers samples"), out.out
    assert named(2, "hidden_states shard 2", "missing", "covers samples"), out.out
    assert named(3, "stray", ".partial") and named(3, "stray", "input_ids shard 9"), out.out
    assert named(4, "record"), out.out
    assert "resume --repair" in out.err

    rc = F.cli("resume", run, "--repair", "--wait", "--interval", "1")
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert "resubmitting 5 task(s)" in out.out, out.out

    from eagle_batch.store import verify

    assert verify(run) == [], "\n".join(map(str, verify(run)))
    for t in range(N_TASKS):
        ref = F.store_of(reference5, t)
        assert F.assert_same_store(F.store_of(run, t), ref) > 0
        st = json.loads((run / "state" / f"task-{t:05d}.json").read_text())
        b, _ = _bounds(ref)
        # Only the samples from the first damaged one on were recomputed (all committed ones before it kept).
        assert st["status"] == "done" and st["attempt_tokens"] == int(b[-1] - b[keep[t]]), (t, keep[t], st)
        assert not (run / "state" / f"repair-{t:05d}.json").exists()
    assert keep[3] == 4 and all(keep[t] < 4 for t in (0, 1, 2, 4)), keep

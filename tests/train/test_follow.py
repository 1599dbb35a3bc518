"""Pipelined training (train.follow): the trainer reads only committed samples, never one twice in an epoch,
sees the data grow from epoch to epoch, and a resumed trainer plans the epoch it stopped in exactly as before."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import torch
from conftest import TINY, TINY_LAYERS, tiny_cfg, write_fake_target
from helpers import random_samples

from eagle_batch.config.schema import StoreConfig
from eagle_batch.store import StoreSpec, TaskStoreWriter
from eagle_batch.store.follow import RunStores, split_id
from eagle_batch.store.record import read_record

NUM_TASKS = 3
PER_TASK = 24


def _task_samples(task: int) -> list[dict]:
    out = random_samples(PER_TASK, TINY_LAYERS, TINY["hidden"], TINY["vocab"], seed=100 + task)
    for j, s in enumerate(out):
        s["sample_id"] = f"t{task}-{j}"
    return out


def _writer(run_dir: Path, task: int) -> TaskStoreWriter:
    path = run_dir / "stores" / f"task-{task:05d}.zarr"
    spec = StoreSpec(layer_ids=TINY_LAYERS, hidden_size=TINY["hidden"])
    return TaskStoreWriter.open(path, spec, StoreConfig(fsync=False))


def _append(w: TaskStoreWriter, samples: list[dict]) -> None:
    for s in samples:
        w.append(s["sample_id"], s["input_ids"].numpy().astype(np.int32), s["loss_mask"].numpy(), s["hidden_states"])
    w.commit()


def _extract(run_dir: Path, tasks: range, per_commit: int, pause_s: float) -> None:
    """What an extraction does to the stores: tasks one after another, each committing `per_commit` samples
    at a time, and marked complete at its end."""
    for t in tasks:
        w = _writer(run_dir, t)
        samples = _task_samples(t)
        for k in range(0, PER_TASK, per_commit):
            _append(w, samples[k : k + per_commit])
            time.sleep(pause_s)
        w.finalize()
        w.close()


def _cfg(run_dir: Path, target: Path, *extra: str):
    return tiny_cfg(
        run_dir,
        target,
        "train.follow=true",
        f"extract.num_tasks={NUM_TASKS}",
        "train.follow_poll_s=0.05",
        "train.follow_timeout_s=60",
        "train.draft_vocab_size=64",
        "train.batch_tokens=192",
        "train.checkpoint_every=1000",
        *extra,
    )


def test_a_pipelined_trainer_reads_only_committed_samples_once_per_epoch(tmp_path):
    from eagle_batch.train.trainer import train

    run_dir = tmp_path / "run"
    target = write_fake_target(tmp_path / "target")
    writer = threading.Thread(target=_extract, args=(run_dir, range(NUM_TASKS), 4, 0.15))
    seen: list[tuple[float, list[int]]] = []
    writer.start()
    try:
        r = train(
            _cfg(run_dir, target, "train.steps=60"),
            on_step=lambda step, batch: seen.append((time.time(), batch["index"].tolist())),
        )
    finally:
        writer.join()
    assert r["status"] == "done" and r["step"] == 60
    out = Path(r["out_dir"])
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    snaps = [e for e in events if e.get("event") == "snapshot"]
    # The data grew while the trainer ran: later epochs saw more committed samples than the first.
    assert snaps[0]["samples"] < NUM_TASKS * PER_TASK
    assert snaps[-1]["samples"] > snaps[0]["samples"]
    assert [e["epoch"] for e in snaps] == list(range(len(snaps)))
    # Replay the epochs: each step's samples belong to its epoch, and no sample comes twice in one epoch.
    stores = RunStores(run_dir, NUM_TASKS)
    epoch, read_in_epoch, left = 0, set(), snaps[0]["steps_in_epoch"]
    for _, ids in seen:
        while left == 0:
            epoch, read_in_epoch = epoch + 1, set()
            left = snaps[epoch]["steps_in_epoch"]
        assert not read_in_epoch & set(ids), f"epoch {epoch} read a sample twice"
        read_in_epoch |= set(ids)
        left -= 1
        for gid in ids:
            t, j = split_id(gid)
            assert j < int(read_record(stores.store_path(t))["num_samples"])
    # Every read sample was committed before it was read: its id is in a commit that precedes the step.
    assert sum(len(ids) for _, ids in seen) > 0


def _run_until(cfg, steps: int | None = None) -> tuple[dict, list[list[int]]]:
    from eagle_batch.train.trainer import train

    seen: list[list[int]] = []
    r = train(cfg, max_steps_this_run=steps or 0, on_step=lambda step, batch: seen.append(batch["index"].tolist()))
    return r, seen


def test_a_resumed_pipelined_trainer_replans_its_epoch_from_the_checkpoint(tmp_path):
    from eagle_batch.train.follow import FollowPlan

    run_dir = tmp_path / "run"
    target = write_fake_target(tmp_path / "target")
    _extract(run_dir, range(1), 6, 0)  # task 0 complete, tasks 1 and 2 not started: a third of the data
    cfg = _cfg(run_dir, target, "train.steps=40")
    first, seen_before = _run_until(cfg, steps=5)
    assert first["status"] == "stopped" and first["step"] == 5
    out = Path(first["out_dir"])
    ckpt = torch.load(next((out / "checkpoints").glob("step-*.pt")), weights_only=False)
    snap = ckpt["follow_snapshot"]
    assert snap["counts"] == {"0": PER_TASK} and ckpt["epoch"] == 0
    # Extraction goes on before the resume: the epoch that was stopped keeps its samples; later epochs grow.
    _extract(run_dir, range(1, NUM_TASKS), 6, 0)
    shutil.rmtree(out / "follow")  # the checkpoint's copy of the snapshot is enough
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    resumed, seen_after = _run_until(cfg)
    assert resumed["status"] == "done" and resumed["step"] == 40
    plan = FollowPlan(RunStores(run_dir, NUM_TASKS), out, 0, 1, cfg.train)
    plan.restore(0, snap)
    epoch0 = plan.rank_batches(0, 0)
    assert seen_before + seen_after[: len(epoch0) - 5] == epoch0
    assert all(split_id(g)[0] == 0 for ids in epoch0 for g in ids)
    assert any(split_id(g)[0] > 0 for ids in seen_after[len(epoch0) - 5 :] for g in ids)
    # The same resume in a copy of the run trains the same draft, bit for bit.
    cfg2 = _cfg(copy, target, "train.steps=40")
    shutil.rmtree(copy / "train" / cfg.train.name / "follow", ignore_errors=True)
    again, _ = _run_until(cfg2)
    a = torch.load(next((out / "checkpoints").glob("step-00000040.pt")), weights_only=False)["model"]
    b_dir = Path(again["out_dir"]) / "checkpoints"
    b = torch.load(next(b_dir.glob("step-00000040.pt")), weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_held_out_samples_are_never_trained_on_and_are_scored(tmp_path):
    run_dir = tmp_path / "run"
    target = write_fake_target(tmp_path / "target")
    _extract(run_dir, range(NUM_TASKS), PER_TASK, 0)
    r, seen = _run_until(_cfg(run_dir, target, "train.steps=12", "train.holdout_fraction=0.25"))
    assert r["status"] == "done"
    result = json.loads((Path(r["out_dir"]) / "result.json").read_text())
    held = result["heldout"]
    assert 0 < held["samples"] < NUM_TASKS * PER_TASK and held["loss"] > 0
    assert 1.0 <= held["acceptance_length"] <= 1.0 + 3
    stores = RunStores(run_dir, NUM_TASKS)
    from eagle_batch.train.follow import is_heldout

    trained = {stores.sample_id(g) for ids in seen for g in ids}
    assert trained and not any(is_heldout(s, 0.25) for s in trained)

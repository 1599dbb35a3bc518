"""Trainer: the loss goes down, metrics are written, kill + resume continues with the same data order
and ends bit-identical to an uninterrupted run; the batch plan shards and budgets as promised."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_cfg

from eagle_batch.train.data import BatchPlan
from eagle_batch.train.trainer import latest_checkpoint, train

# Runs in the test half that starts the vLLM engines (scripts/test.sh): evens the two halves' wall time.
pytestmark = pytest.mark.engine_half


def test_batch_plan_budget_determinism_and_sharding():
    lengths = np.random.default_rng(0).integers(5, 200, 500)
    plan = BatchPlan(lengths, batch_tokens=1024, seed=3, world_size=2)
    e0 = plan.epoch_batches(0)
    assert e0 == BatchPlan(lengths, 1024, 3, 2).epoch_batches(0)  # deterministic
    assert e0 != plan.epoch_batches(1)  # reshuffled per epoch
    for b in e0:
        assert max(lengths[b]) * len(b) <= 1024 or len(b) == 1
    flat = [i for b in e0 for i in b]
    assert len(flat) == len(set(flat))  # no sample twice in an epoch
    r0, r1 = plan.rank_batches(0, 0), plan.rank_batches(0, 1)
    assert len(r0) == len(r1) == len(e0) // 2  # DDP ranks take the same number of steps
    assert not set(i for b in r0 for i in b) & set(i for b in r1 for i in b)
    # length bucketing: padding waste is small
    padded = sum(max(lengths[b]) * len(b) for b in e0)
    assert sum(lengths[i] for i in flat) / padded > 0.85


# The defaults are speculators' EAGLE-3 recipe (decision 0021); SpecForge's settings stay one override away.
SPECFORGE_SETTINGS = (
    "train.norm_before_fc=false",
    "train.norm_before_residual=false",
    "train.norm_output=false",
    "train.optimizer=adamw",
    "train.ttt_decay=0.8",
    "train.lm_head_init=random",
    "train.freeze_lm_head=false",
)


@pytest.mark.parametrize("recipe", [(), SPECFORGE_SETTINGS], ids=["defaults", "specforge-settings"])
def test_train_loss_decreases_and_metrics(tmp_path, fake_target, tiny_dataset, recipe):
    cfg = tiny_cfg(
        tmp_path / "run", fake_target, "train.steps=30", "train.lr=1e-2", "train.checkpoint_every=100", *recipe
    )
    r = train(cfg, dataset=tiny_dataset)
    assert r["status"] == "done" and r["step"] == 30
    out = tmp_path / "run" / "train" / "draft"
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in recs if "loss" in x]
    assert len(steps) == 30 and len(steps[0]["acc_per_step"]) == 3 and len(steps[0]["loss_per_step"]) == 3
    for x in steps:  # the chain (steps 0..s all right) never exceeds step s alone; 1 + its sum is the estimate
        assert all(c <= a + 1e-9 for c, a in zip(x["acc_chain_per_step"], x["acc_per_step"]))
        assert x["expected_acceptance_length"] == pytest.approx(1 + sum(x["acc_chain_per_step"]))
    # step 0 sees the state that determines its target (helpers.random_samples): it must learn it
    first = np.mean([x["loss_per_step"][0] for x in steps[:5]])
    last = np.mean([x["loss_per_step"][0] for x in steps[-5:]])
    assert last < first * 0.8, (first, last)
    assert np.mean([x["acc_per_step"][0] for x in steps[-5:]]) > np.mean([x["acc_per_step"][0] for x in steps[:5]])
    assert (out / "export" / "config.json").is_file() and (out / "export" / "model.safetensors").is_file()


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_kill_resume_same_data_order_and_identical_result(tmp_path, fake_target, tiny_dataset, optimizer):
    def run(run_dir, *, limit=0, order=None):
        cfg = tiny_cfg(run_dir, fake_target, "train.steps=7", "train.epochs=0", f"train.optimizer={optimizer}")
        return train(
            cfg,
            dataset=tiny_dataset,
            max_steps_this_run=limit,
            on_step=lambda s, b: order.append((s, b["index"].tolist())) if order is not None else None,
        )

    ref_order: list = []
    ref = run(tmp_path / "a", order=ref_order)
    assert ref["status"] == "done"
    order: list = []
    first = run(tmp_path / "b", limit=3, order=order)  # "killed" after 3 steps (checkpoint written)
    assert first["status"] == "stopped" and first["step"] == 3
    assert latest_checkpoint(tmp_path / "b" / "train" / "draft").name == "step-00000003.pt"
    second = run(tmp_path / "b", order=order)
    assert second["status"] == "done" and second["step"] == 7
    assert order == ref_order  # same batches, same order, nothing repeated or skipped
    # The resumed run ends exactly where the uninterrupted one does (model, optimizer, schedule).
    a = torch.load(latest_checkpoint(tmp_path / "a" / "train" / "draft"), weights_only=False)
    b = torch.load(latest_checkpoint(tmp_path / "b" / "train" / "draft"), weights_only=False)
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0)
    scheds = [a["scheduler"], b["scheduler"]]
    if optimizer == "muon":  # one schedule per optimizer: Muon's (the 2-D weights) and AdamW's (the rest)
        assert len(a["optimizer"]) == len(a["scheduler"]) == 2
        scheds = [s for pair in zip(a["scheduler"], b["scheduler"]) for s in pair]
    assert all(s["last_epoch"] == 7 for s in scheds)


def test_aux_layers_reach_fc_in_ascending_order(tmp_path, fake_target):
    """vLLM hands the aux states to the draft's fc in ascending layer order (0.32 sorts them, 0.26 appends
    them as its layer loop passes them), whatever order the config lists: training must concatenate them
    the same way, or fc's input blocks are swapped when the draft is served."""
    from conftest import TINY
    from helpers import random_samples

    from eagle_batch.train.data import InMemoryDataset, TrainSamples
    from eagle_batch.train.trainer import resolve_layers

    stored = [4, 2, 6, 3]  # a store extracted with model.layer_ids in this order
    ds = InMemoryDataset(random_samples(30, stored, TINY["hidden"], TINY["vocab"]), stored)
    for extra in ([], ["train.aux_layer_ids=[4,3,2]"]):
        cfg = tiny_cfg(tmp_path / "run", fake_target, *extra)
        aux, last = resolve_layers(cfg, stored)
        assert (aux, last) == ([2, 3, 4], 6)
    x = TrainSamples(ds, aux, last)[0]
    hs = ds[0]["hidden_states"]
    want = torch.cat([hs[:, stored.index(i)] for i in (2, 3, 4)], dim=-1)
    assert torch.equal(x["aux"], want) and torch.equal(x["last"], hs[:, stored.index(6)])
    r = train(tiny_cfg(tmp_path / "run", fake_target, "train.steps=1", "train.aux_layer_ids=[4,3,2]"), dataset=ds)
    conf = json.loads((Path(r["export_dir"]) / "config.json").read_text())
    assert conf["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]


def test_lm_head_init_target_and_freeze(tmp_path, fake_target, tiny_dataset):
    """train.lm_head_init=target starts from the target's lm_head rows; freeze_lm_head keeps them."""
    from eagle_batch.train.model import target_head

    cfg = tiny_cfg(
        tmp_path / "run", fake_target, "train.steps=3", "train.lm_head_init=target", "train.freeze_lm_head=true"
    )
    train(cfg, dataset=tiny_dataset)
    ck = torch.load(latest_checkpoint(tmp_path / "run" / "train" / "draft"), weights_only=False)
    ids = ck["model"]["d2t"] + torch.arange(ck["model"]["d2t"].numel())
    th = target_head(fake_target)
    torch.testing.assert_close(ck["model"]["lm_head.weight"], th["lm_head"][ids].float())
    assert not torch.equal(ck["model"]["fc.weight"], torch.zeros_like(ck["model"]["fc.weight"]))


@pytest.mark.slow  # runs for its budget (40 s): the measurement must come well before the budget ends
def test_time_budget_sets_the_schedule_length(tmp_path, fake_target, tiny_dataset):
    """train.time_budget_s: after warm-up the speed is measured and the run (and its cosine) sized to end
    with the budget; the draft is exported as usual."""
    import time

    cfg = tiny_cfg(
        tmp_path / "run",
        fake_target,
        "train.steps=100000",
        "train.time_budget_s=40",
        "train.checkpoint_every=100000",
        "train.log_every=5",
        "train.min_lr_ratio=0.1",
        "train.lr=1e-3",
    )
    t0 = time.perf_counter()
    r = train(cfg, dataset=tiny_dataset)
    elapsed = time.perf_counter() - t0
    assert r["status"] == "done" and "export_dir" in r
    recs = [json.loads(x) for x in (tmp_path / "run" / "train" / "draft" / "metrics.jsonl").read_text().splitlines()]
    events = [x for x in recs if x.get("event") == "total_steps"]
    assert events and events[0]["step"] == 25 and events[0]["total_steps"] > 25  # 5 skipped + 20 timed
    assert r["step"] == r["total_steps"] == events[-1]["total_steps"] < 100000
    last = [x for x in recs if "loss" in x][-1]
    if len(events) == 1:  # ended on its schedule (not cut at 1.05x): the cosine reached its floor
        assert abs(last["lr"] - 1e-4) < 1e-6
    assert elapsed < 40 * 1.05 + 30  # the budget bounds the loop; setup and export add a little


def test_max_time_ends_the_run_exported(tmp_path, fake_target, tiny_dataset):
    """train.max_time_s: past the limit the run ends at the step it reached, exported like a finished one; the
    schedule keeps its planned length (cut, not refitted), and a run that finishes in time is unaffected."""
    cfg = tiny_cfg(
        tmp_path / "run", fake_target, "train.steps=100000", "train.max_time_s=2", "train.checkpoint_every=100000"
    )
    r = train(cfg, dataset=tiny_dataset)
    assert r["status"] == "done" and Path(r["export_dir"], "config.json").is_file()
    assert 0 < r["step"] == r["total_steps"] < 100000
    recs = [json.loads(x) for x in (tmp_path / "run" / "train" / "draft" / "metrics.jsonl").read_text().splitlines()]
    (event,) = [x for x in recs if x.get("event") == "total_steps"]
    assert event["why"] == "train.max_time_s 2 s reached" and event["total_steps"] == r["step"]
    last = [x for x in recs if "loss" in x][-1]
    assert last["step"] == r["step"] and last["lr"] > 0.5 * 3e-4  # cut early in a 100000-step cosine
    quick = train(
        tiny_cfg(tmp_path / "run2", fake_target, "train.steps=3", "train.max_time_s=600"), dataset=tiny_dataset
    )
    assert quick["step"] == quick["total_steps"] == 3


def test_muon_takes_the_matrices_adamw_the_rest_and_a_checkpoint_keeps_its_optimizer(tmp_path, fake_target):
    """train.optimizer=muon: Muon steps fc and the projections, AdamW the norms and lm_head (speculators'
    split); resuming a run with the other optimizer is refused with what to do."""
    from conftest import TINY_LAYERS

    from eagle_batch.train.model import Eagle3Draft, draft_config_from_target
    from eagle_batch.train.muon import Float32Muon
    from eagle_batch.train.optim import DraftOptimizer, muon_split

    m = Eagle3Draft(draft_config_from_target(fake_target, TINY_LAYERS[:3], TINY_LAYERS[3], 64))
    matrices, rest = muon_split(m.named_parameters())
    names = {id(p): n for n, p in m.named_parameters()}
    assert {names[id(p)] for p in matrices} == {n for n, p in m.named_parameters() if p.ndim == 2} - {"lm_head.weight"}
    assert "lm_head.weight" in {names[id(p)] for p in rest} and all(
        p.ndim == 1 for p in rest if p is not m.lm_head.weight
    )
    tc = tiny_cfg(tmp_path, fake_target, "train.optimizer=muon").train
    opt = DraftOptimizer(m, tc, 10, torch.device("cpu"))
    assert isinstance(opt.optimizers[0], torch.optim.Muon) and isinstance(opt.optimizers[1], torch.optim.AdamW)
    # on the CPU its orthogonalization runs in float32 (bfloat16 matmuls are emulated there)
    assert isinstance(opt.optimizers[0], Float32Muon)
    opt.set_total(20)
    assert opt.schedule.total == 20 and all(s.lr_lambdas[0] is opt.schedule for s in opt.schedulers)
    saved = opt.state_dict()
    adamw = DraftOptimizer(m, tiny_cfg(tmp_path, fake_target, "train.optimizer=adamw").train, 10, torch.device("cpu"))
    with pytest.raises(ValueError, match="train.optimizer=muon.*resume with train.optimizer=muon"):
        adamw.load_state_dict(*saved)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "older-checkpoint"])
def test_resume_with_other_draft_settings_is_refused_with_what_to_do(tmp_path, fake_target, tiny_dataset, recorded):
    """A run trained with SpecForge's settings resumed under the defaults (other norm options, a frozen
    lm_head) would load weights that mean something else: refused, naming the settings to resume with. A
    checkpoint that predates the record is checked against the run's draft_config.json."""
    from eagle_batch.config.load import ConfigError

    run = tmp_path / "run"
    first = tiny_cfg(run, fake_target, "train.steps=2", "train.checkpoint_every=1", *SPECFORGE_SETTINGS)
    train(first, dataset=tiny_dataset)
    ck_path = latest_checkpoint(run / "train" / "draft")
    if not recorded:
        ck = torch.load(ck_path, weights_only=False)
        del ck["draft_settings"]
        torch.save(ck, ck_path)
    with pytest.raises(ConfigError) as e:
        train(tiny_cfg(run, fake_target, "train.steps=4", "train.optimizer=adamw"), dataset=tiny_dataset)
    msg = str(e.value)
    assert "resume with train.norm_before_fc=false train.norm_before_residual=false train.norm_output=false" in msg
    assert ("train.freeze_lm_head=false" in msg) == recorded  # an older checkpoint did not record it
    assert "another train.name" in msg
    # resumed with the settings it was trained with, it goes on to the end
    r = train(tiny_cfg(run, fake_target, "train.steps=4", *SPECFORGE_SETTINGS), dataset=tiny_dataset)
    assert r["status"] == "done" and r["step"] == 4


def test_checkpoint_saves_are_timed_apart_from_the_data_wait(tmp_path, fake_target, tiny_dataset, monkeypatch):
    """data_wait_frac is the share of a window spent waiting for batches: a slow checkpoint save lands in
    checkpoint_s, not in the wait (nor in tokens/s)."""
    import time

    from eagle_batch.train import trainer

    real_save = trainer.save_checkpoint

    def slow_save(*a, **k):
        time.sleep(0.3)
        return real_save(*a, **k)

    monkeypatch.setattr(trainer, "save_checkpoint", slow_save)
    cfg = tiny_cfg(tmp_path / "run", fake_target, "train.steps=8", "train.log_every=4", "train.checkpoint_every=2")
    assert train(cfg, dataset=tiny_dataset)["status"] == "done"
    recs = [json.loads(x) for x in (tmp_path / "run" / "train" / "draft" / "metrics.jsonl").read_text().splitlines()]
    windows = [x for x in recs if x.get("step") in (4, 8) and "loss" in x]
    assert len(windows) == 2
    # A save after a log step counts in the next window: step 2's in the first, 4's and 6's in the second.
    assert [round(w["checkpoint_s"] / 0.3) for w in windows] == [1, 2], windows
    assert all(w["data_wait_frac"] < 0.2 for w in windows), windows

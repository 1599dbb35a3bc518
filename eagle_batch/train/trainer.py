"""EAGLE-3 draft training: the loop, checkpoint/resume, metrics, progress, DDP.

    from eagle_batch.train.trainer import train
    result = train(cfg)                    # cfg: RunConfig; data = open_dataset(cfg.run_dir)
    result = train(cfg, dataset=ds)        # any train.data.TrainingData (tests: InMemoryDataset)

The loss (train/loss.py): soft cross-entropy against the target's next-token distribution, computed from
the stored last-layer state (id N, pre-final-norm) through the target's own final norm and lm_head
(train/target.py), restricted to the draft vocabulary, per TTT step; alignment as vLLM's eagle proposer
feeds the draft (see loss.py).

A step is built to keep a GPU busy: bf16 autocast (fp32 master weights), the optimizers of train/optim.py, no
host-device synchronization except on log steps (the loss, statistics and gradient norm stay on the device;
token counts come from the CPU batch; DDP's stop flag is read one step late), the TTT attention on SDPA's
fused causal kernels (model.ttt_attention), and optionally the loss's memory-bound passes compiled
(`train.compile`).

Outputs in `out_dir` (default RUN/train/<name>): checkpoints/step-XXXXXXXX.pt + checkpoints/latest,
metrics.jsonl (one line per logged step), tb/ (TensorBoard), export/ (the vLLM folder), result.json.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle_batch.store.damage import DamagedSamples
from eagle_batch.store.provenance import write_sources

from .checkpoint import (
    check_resume_settings,
    draft_settings,
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from .data import EpochLoader, TrainSamples, build_vocab_map, token_frequencies
from .distributed import StopFlag, all_reduce_sum, init_distributed, shutdown_distributed
from .fit import check_checkpoint_fits, check_data_fits_target, note_emulated_bf16, note_full_vocab
from .heldout import evaluate_heldout
from .inputs import (
    TrainingInputs,
    follow_state,
    heldout_of,
    prepared_loss_token_counts,
    resolve_layers,
    training_inputs,
)
from .loss import CrossEntropyKernels, plan_to, ttt_loss, ttt_plan
from .model import Eagle3Draft, draft_config_from_target, export_draft
from .optim import DraftOptimizer
from .progress import Metrics, TrainProgress, setup_note
from .schedule import TimeBudget, TimeLimit
from .target import TargetHead, target_head

__all__ = ["train", "ttt_loss", "output_dir", "latest_checkpoint", "init_distributed", "shutdown_distributed"]

# Intra-op CPU threads of a trainer process that computes on a GPU (_setup says why).
TRAINER_CPU_THREADS = 4

# ----------------------------------------------------------------------------------------------------
# Training


def output_dir(cfg) -> Path:
    return Path(cfg.train.output_dir) if cfg.train.output_dir else Path(cfg.run_dir) / "train" / cfg.train.name


@dataclass
class _Run:
    """One training invocation: what it trains, with what, and where it is."""

    tc: Any
    rank: int
    world: int
    device: torch.device
    out: Path
    samples: TrainSamples
    plan: Any  # rank_batches(epoch, rank), steps_per_epoch(): a BatchPlan, a TrainSubset or a FollowPlan
    total_steps: int
    dcfg: Any
    model: Eagle3Draft
    head: TargetHead
    params: list
    opt: DraftOptimizer
    ckpt_path: Path | None
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    budget_total: int = 0  # the total steps train.time_budget_s set (kept across a resume)
    inputs: TrainingInputs | None = None


def _check_choices(cfg) -> None:
    """The train section's values (choices and ranges), as every command checks them: a caller of train()
    that skipped the command's checks gets the same ConfigError before anything is built."""
    from eagle_batch.config import check_values

    check_values(cfg, sections=("train",))


def _build_model(cfg, dataset, aux_ids, last_id, rank, out, device, progress):
    """(draft config, draft, target head, checkpoint or None, its path): a fresh draft (vocabulary from the
    data's loss tokens) or the one in out/checkpoints/latest."""
    tc = cfg.train
    dcfg = draft_config_from_target(
        cfg.model.path,
        aux_ids,
        last_id,
        tc.draft_vocab_size,
        tc.draft_intermediate_size,
        tc.draft_num_heads,
        tc.draft_num_kv_heads,
    )
    dcfg = replace(
        dcfg,
        norm_before_fc=bool(tc.norm_before_fc),
        norm_before_residual=bool(tc.norm_before_residual),
        norm_output=bool(tc.norm_output),
    )
    if rank == 0:
        note_full_vocab(cfg, dcfg.vocab_size)
    th = target_head(cfg.model.path)
    model = Eagle3Draft(dcfg, th["embed"]).to(device)
    model.midlayer.self_attn.impl = tc.ttt_attention
    ckpt_path = latest_checkpoint(out)
    ckpt = load_checkpoint(ckpt_path) if ckpt_path else None
    if ckpt is not None:
        check_resume_settings(ckpt, out, tc)
        check_checkpoint_fits(ckpt, ckpt_path, dcfg)
        model.load_state_dict(ckpt["model"])
        progress.note(f"resuming from {ckpt_path} (step {ckpt['step']})")
    else:
        freq = prepared_loss_token_counts(out, dcfg.vocab_size) if tc.follow else None
        if freq is None:
            progress.note(f"draft vocabulary: counting the loss tokens of {len(dataset)} samples")
            freq = token_frequencies(
                dataset, dcfg.vocab_size, damaged=DamagedSamples(tc.on_damaged, "eagle-batch train")
            )
        model.set_vocab_map(build_vocab_map(freq, dcfg.draft_vocab_size).to(device))
        if tc.lm_head_init == "target":
            model.init_head_from_target(th["lm_head"], th["norm"])
        covered = float(freq[model.draft_to_target.cpu().numpy()].sum() / max(1, freq.sum()))
        distinct = int((freq > 0).sum())
        progress.note(
            f"draft vocabulary: {dcfg.draft_vocab_size} tokens cover {covered:.2%} of the loss tokens "
            f"({distinct} distinct)"
        )
        if rank == 0:
            rec = {
                "draft_vocab_size": dcfg.draft_vocab_size,
                "distinct_tokens": distinct,
                "loss_token_coverage": covered,
            }
            (out / "vocab.json").write_text(json.dumps(rec) + "\n")
    if tc.freeze_lm_head:
        model.lm_head.weight.requires_grad_(False)
    # bf16 on a GPU (as vLLM runs the target's lm_head); fp32 on a CPU, where bf16 matmuls are slow.
    head_dtype = torch.bfloat16 if tc.precision == "bf16" and device.type == "cuda" else torch.float32
    head = TargetHead(
        th["norm"],
        th["lm_head"],
        dcfg.rms_norm_eps,
        model.draft_to_target.cpu(),
        full_argmax=tc.accuracy_vs == "full",
        dtype=head_dtype,
    ).to(device)
    return dcfg, model, head, ckpt, ckpt_path


def _setup(cfg, dataset, progress_enabled: bool) -> tuple[_Run, TrainProgress, dict | None]:
    tc = cfg.train
    _check_choices(cfg)
    rank, world, device = init_distributed()
    out = output_dir(cfg)
    torch.manual_seed(tc.seed)
    np.random.seed(tc.seed)
    random.seed(tc.seed)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for the fp32 matmuls left outside autocast
        # This process's CPU work on a GPU is bookkeeping on small tensors (the batch's TTT plan, indexes);
        # a pool of intra-op threads as wide as the machine only contends with the loader's workers and the
        # neighbours' (the H200 profile: ~60 ms of a 0.42 s step in CPU indexing; docs/explanation/training.md, "A
        # training step on a GPU").
        torch.set_num_threads(min(torch.get_num_threads(), TRAINER_CPU_THREADS))
    inputs = training_inputs(cfg, dataset, out, rank, world, note=setup_note(rank, progress_enabled))
    dataset, plan, total_steps = inputs.checks, inputs.plan, inputs.total_steps
    check_data_fits_target(cfg, dataset, str(tc.data or cfg.run_dir))
    aux_ids, last_id = resolve_layers(cfg, list(dataset.layer_ids))
    samples = TrainSamples(inputs.data, aux_ids, last_id, tc.max_length, tc.on_damaged)
    progress = TrainProgress(total_steps, 0, enabled=progress_enabled and rank == 0)
    progress.note(
        f"{inputs.size[0]} samples, {inputs.size[1]:,} tokens (max_length {tc.max_length})"
        + (" committed so far (train.follow: more join at each epoch)" if inputs.follow else "")
        + f"; {plan.steps_per_epoch()} steps per epoch of <= {tc.batch_tokens} tokens x {world} rank(s); "
        f"{total_steps} steps"
    )
    if rank == 0:  # after the data checks: a refused training leaves no empty draft folder behind
        out.mkdir(parents=True, exist_ok=True)
        note_emulated_bf16(cfg, device.type)
    dcfg, model, head, ckpt, ckpt_path = _build_model(cfg, dataset, aux_ids, last_id, rank, out, device, progress)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = DraftOptimizer(model, tc, total_steps, device)
    r = _Run(tc, rank, world, device, out, samples, plan, total_steps, dcfg, model, head, params, opt, ckpt_path)
    r.inputs = inputs
    if ckpt is not None:
        if inputs.follow is not None and "follow_snapshot" in ckpt:
            inputs.follow.restore(int(ckpt["epoch"]), ckpt["follow_snapshot"])
        opt.load_state_dict(ckpt["optimizer"], ckpt["scheduler"])
        r.step, r.epoch, r.batch_in_epoch = ckpt["step"], ckpt["epoch"], ckpt["batch_in_epoch"]
        r.budget_total = int(ckpt.get("budget_total", 0))
        r.total_steps = r.budget_total or total_steps
        opt.set_total(r.total_steps)
        progress.set_total(r.total_steps)
        rngs = ckpt.get("rng", {})
        if str(rank) in rngs:
            set_rng_state(rngs[str(rank)])
        if ckpt.get("world_size", world) != world:
            print(
                f"[eagle-batch train] resuming a {ckpt.get('world_size')}-rank checkpoint on {world} ranks: "
                "the data order after this point differs from the original run"
            )
    progress.start = r.step
    return r, progress, ckpt


def _checkpoint_state(r: _Run) -> dict:
    """Everything a resume needs; a collective (every rank's RNG state is gathered)."""
    rngs = [None] * r.world
    mine = rng_state()
    if r.world > 1:
        torch.distributed.all_gather_object(rngs, mine)
    else:
        rngs = [mine]
    opt_state, sched_state = r.opt.state_dict()
    return {
        "model": r.model.state_dict(),
        "draft_settings": draft_settings(r.tc),
        "optimizer": opt_state,
        "scheduler": sched_state,
        "step": r.step,
        "epoch": r.epoch,
        "batch_in_epoch": r.batch_in_epoch,
        "budget_total": r.budget_total,
        "world_size": r.world,
        "rng": {str(i): s for i, s in enumerate(rngs)},
        "draft_config": r.dcfg.to_json(),
        "train_config": asdict(r.tc),
        "sources": r.samples.ds.sources(),  # the committed records of the stores read (store/provenance.py)
    } | follow_state(r.inputs, r.epoch)


class _Window:
    """One logging window: device-side sums (added without a sync) and host-side timings."""

    def __init__(self, k: int, device: torch.device):
        self.loss = torch.zeros((), device=device)
        self.stats = torch.zeros(3 * k, device=device)  # loss_sum | correct | chain, per TTT step
        self.count = torch.zeros(2 * k)  # counted rows | rows a chain is judged on, per TTT step (host)
        self.wait = self.compute = self.checkpoint_s = 0.0
        self.tokens = self.steps = 0


def _log_record(r: _Run, win: _Window, gnorm: torch.Tensor | None) -> dict:
    """The metrics line of a log step: the only place the loop reads device values."""
    k = r.tc.ttt_steps
    vec = all_reduce_sum(torch.cat([win.stats.detach(), win.count.to(r.device)]))
    loss = all_reduce_sum(win.loss.detach().clone()) / max(1, win.steps * r.world)
    cnt = vec[3 * k : 4 * k].clamp_min(1)
    chain = (vec[2 * k : 3 * k] / vec[4 * k :].clamp_min(1)).tolist()
    elapsed = max(win.wait + win.compute, 1e-9)
    return {
        "step": r.step,
        "epoch": r.epoch,
        "lr": r.opt.last_lr(),
        "loss": float(loss),
        "loss_per_step": (vec[:k] / cnt).tolist(),
        "acc_per_step": (vec[k : 2 * k] / cnt).tolist(),
        "acc": float(vec[k] / cnt[0]),
        # Rows whose steps 0..s are all right: a server's acceptance per draft position, on training batches;
        # 1 + their sum estimates the mean acceptance length at k = ttt_steps.
        "acc_chain_per_step": chain,
        "expected_acceptance_length": 1.0 + sum(chain),
        "grad_norm": float(gnorm) if gnorm is not None else 0.0,
        "tokens_per_s": win.tokens * r.world / elapsed,
        "step_s": elapsed / max(1, win.steps),  # wall seconds per step in this window (data wait included)
        "data_wait_frac": win.wait / elapsed,
        "checkpoint_s": win.checkpoint_s,  # saving, outside the rate and the wait above
        # The most GPU memory this rank's tensors held so far (torch's allocator; 0 on the CPU), in GiB.
        "peak_gpu_memory_gib": _peak_gpu_gib(r.device),
        "steps_in_window": win.steps,
        "time": time.time(),
    }


def _peak_gpu_gib(device: torch.device) -> float:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if device.type == "cuda" else 0.0


def _train_step(r: _Run, ddp: Any, batch: dict, plan: dict, kernels: CrossEntropyKernels, autocast: bool):
    r.model.train()
    model = r.model if r.world == 1 else _DDPProxy(ddp, r.model)
    loss, st = ttt_loss(model, r.head, batch, r.tc.ttt_steps, r.tc.ttt_decay, autocast, kernels, plan)
    r.opt.zero_grad()
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(r.params, r.tc.grad_clip) if r.tc.grad_clip > 0 else None
    r.opt.step()
    return loss, st, gnorm


def _set_total(r: _Run, total: int, progress: TrainProgress, metrics: Any, why: str) -> None:
    """Move the end of the run (and of the cosine) to step `total`."""
    r.total_steps = r.budget_total = total
    r.opt.set_total(total)
    progress.set_total(total)
    progress.note(f"{why}: the run ends at step {total}")
    metrics.log({"event": "total_steps", "step": r.step, "total_steps": total, "why": why})


def _loop(r: _Run, ddp, metrics, progress, should_stop, max_steps_this_run, on_step) -> str:
    """Run steps until the plan's end, a stop request or the step limit; returns "done" or "stopped"."""
    tc, device = r.tc, r.device
    kernels = CrossEntropyKernels(compiled=tc.compile)
    autocast = tc.precision == "bf16"
    stop_flag = StopFlag(r.world, device)
    status, steps_this_run, gnorm = "done", 0, None
    win = _Window(tc.ttt_steps, device)
    budget = TimeBudget(0.0 if r.budget_total else tc.time_budget_s)  # a resumed budget run keeps its total
    limit = TimeLimit(tc.max_time_s)
    # An empty epoch raises "no training batches" from the stream's first batch.
    stream = EpochLoader(
        r.samples,
        r.plan,
        r.rank,
        num_workers=tc.num_workers,
        prefetch_factor=tc.prefetch_factor,
        pin_memory=device.type == "cuda",
    ).stream(r.epoch, skip=r.batch_in_epoch)
    t_last = time.perf_counter()
    budget.start()
    limit.start()
    try:
        for epoch, index, batch in stream if r.step < r.total_steps else ():
            t_got = time.perf_counter()
            tokens = int(batch["lengths"].sum())  # the CPU batch: no device sync
            plan = plan_to(ttt_plan(batch["loss_mask"], tc.ttt_steps), device)
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            loss, st, gnorm = _train_step(r, ddp, batch, plan, kernels, autocast)
            win.loss += loss.detach()
            win.stats += torch.cat([st["loss_sum"], st["correct"], st["chain"]])
            win.count += torch.cat([st["count"], st["chain_count"]])
            r.step, r.epoch, r.batch_in_epoch = r.step + 1, epoch, index + 1
            steps_this_run += 1
            if on_step is not None:
                on_step(r.step, batch)
            new_total = budget.new_total(r, steps_this_run)
            if new_total is not None:
                _set_total(r, new_total, progress, metrics, f"time budget {tc.time_budget_s:g} s")
            log_now = r.step % max(1, tc.log_every) == 0 or r.step == r.total_steps or r.step == 1
            if budget.over(r, log_now) and r.step < r.total_steps:
                _set_total(r, r.step, progress, metrics, "past 1.05x the time budget")
                log_now = True
            elif r.step < r.total_steps and limit.reached(r, log_now):
                _set_total(r, r.step, progress, metrics, f"train.max_time_s {tc.max_time_s:g} s reached")
                log_now = True
            if log_now and device.type == "cuda":
                torch.cuda.synchronize()  # the window's wall time then covers its device work
            t_done = time.perf_counter()
            win.wait, win.compute = win.wait + t_got - t_last, win.compute + t_done - t_got
            win.tokens, win.steps = win.tokens + tokens, win.steps + 1
            t_last = t_done
            progress.step()
            if log_now:
                rec = _log_record(r, win, gnorm)
                metrics.log(rec)
                progress.log(rec)
                win = _Window(tc.ttt_steps, device)
                t_last = time.perf_counter()
            stop_now = stop_flag(
                bool(should_stop()) or bool(max_steps_this_run and steps_this_run >= max_steps_this_run)
            )
            if r.step % max(1, tc.checkpoint_every) == 0 or stop_now or r.step == r.total_steps:
                st_ = _checkpoint_state(r)  # collective: every rank calls it
                if r.rank == 0:
                    save_checkpoint(r.out, st_)
                # The next batch's wait starts after the save: saving is neither data wait nor compute.
                t_saved = time.perf_counter()
                win.checkpoint_s += t_saved - t_last
                t_last = t_saved
            if stop_now and r.step < r.total_steps:
                status = "stopped"
                break
            if r.step >= r.total_steps:
                break
    finally:
        stop_flag.drain()
        stream.close()
    return status


def train(
    cfg,
    dataset: Any = None,
    should_stop: Callable[[], bool] = lambda: False,
    max_steps_this_run: int = 0,
    on_step: Callable[[int, dict], None] | None = None,
) -> dict:
    """Train (or resume) the draft described by `cfg`; export at the end. Returns a summary dict.

    `should_stop()` is polled after every step: when true, a checkpoint is written and the function
    returns with status "stopped" (Slurm time limit / preemption). `max_steps_this_run` stops after that
    many steps of this invocation (tests of kill/resume). `on_step(step, batch)` is called after each
    optimizer step (hooks, tests of the data order). Progress (train/progress.py) goes to stderr on rank 0
    unless `train.progress` is false.
    """
    r, progress, ckpt = _setup(cfg, dataset, cfg.train.progress)
    ddp = r.model
    if r.world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(
            r.model, device_ids=[r.device.index] if r.device.type == "cuda" else None
        )
    metrics = Metrics(r.out, r.rank == 0, r.tc.tensorboard)
    if r.rank == 0:
        (r.out / "draft_config.json").write_text(json.dumps(r.dcfg.to_json(), indent=2) + "\n")
        metrics.log(
            {
                "event": "start",
                "step": r.step,
                "time": time.time(),
                "resumed_from": str(r.ckpt_path) if r.ckpt_path else None,
                "total_steps": r.total_steps,
                "steps_per_epoch": r.plan.steps_per_epoch(),
                "world_size": r.world,
                "num_samples": len(r.samples),
            }
        )
    del ckpt
    if r.inputs is not None and r.inputs.follow is not None and r.rank == 0:
        r.inputs.follow.on_snapshot = lambda rec: metrics.log({"step": r.step, "time": time.time()} | rec)
    try:
        status = _loop(r, ddp, metrics, progress, should_stop, max_steps_this_run, on_step)
    finally:
        progress.close()
    result = {"status": status, "step": r.step, "total_steps": r.total_steps, "out_dir": str(r.out)}
    if status == "done" and r.rank == 0:
        _finish(r, result, progress, metrics)
    progress.note(
        f"{status} at step {r.step}/{r.total_steps}"
        + (f"; exported {result['export_dir']}" if "export_dir" in result else "")
    )
    metrics.log({"event": status, "step": r.step})
    metrics.close()
    if r.world > 1:
        torch.distributed.barrier()
    return result


def _finish(r: _Run, result: dict, progress: TrainProgress, metrics: Any) -> None:
    """Rank 0 of a finished training: score the held-out samples, export, write result.json."""
    ids, lengths = heldout_of(r.inputs) if r.inputs is not None else ((), ())
    if len(ids):
        progress.note(f"scoring the draft on {len(ids)} held-out samples")
        held = evaluate_heldout(r.model, r.head, r.samples, ids, lengths, r.tc, r.device)
        result["heldout"] = held
        metrics.log({"event": "heldout", "step": r.step} | held)
        progress.note(
            f"held-out: loss {held['loss']:.4f}, teacher-forced acceptance length {held['acceptance_length']:.3f} "
            f"at k={r.tc.ttt_steps} ({held['samples']} samples)"
        )
    if r.tc.export:
        export_dir = export_draft(r.model, r.out / "export")
        write_sources(export_dir, r.samples.ds.sources(), f"eagle-batch train CONFIG (train.name={r.tc.name})")
        result["export_dir"] = str(export_dir)
    if r.tc.export or "heldout" in result:
        (r.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")


class _DDPProxy:
    """The draft as ttt_loss sees it, called through the DDP wrapper (its hooks all-reduce the gradients)."""

    def __init__(self, ddp: Any, model: Eagle3Draft):
        self.ddp, self.cfg, self.draft_to_target = ddp, model.cfg, model.draft_to_target

    def __call__(self, *a, **k):
        return self.ddp(*a, **k)

"""EAGLE-3 draft training: TTT loss, the loop, checkpoint/resume, metrics, DDP.

    from eagle_batch.train.trainer import train
    result = train(cfg)                    # cfg: RunConfig; data = open_dataset(cfg.run_dir)
    result = train(cfg, dataset=ds)        # any dataset with the open_dataset interface (tests)

Targets: the target model's next-token distribution, computed here from the stored last-layer state
(id N, pre-final-norm) through the target's own final norm and lm_head (read from model.path), restricted
to the draft vocabulary (soft cross-entropy = KL up to a constant). Top-1 accuracy per TTT step compares
the draft's argmax (mapped to target ids) with the target's full-vocabulary argmax, i.e. what greedy
verification accepts.

Alignment (vLLM's eagle proposer): draft row i at TTT step s is fed token x[i+s+1] and predicts
x[i+s+2]; its target is the target's distribution at position i+s+1; the loss counts where
loss_mask[i+s+2] == 1. Step 0 gets fc(aux[i]); step s>0 gets step s-1's pre-norm output of the same row.

Outputs in `out_dir` (default RUN/train/<name>): checkpoints/step-XXXXXXXX.pt + checkpoints/latest,
metrics.jsonl (one line per logged step), tb/ (TensorBoard), export/ (the vLLM folder), result.json.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .data import BatchPlan, EpochLoader, TrainSamples, build_vocab_map, token_frequencies
from .model import Eagle3Draft, TargetHead, draft_config_from_target, export_draft, target_head

# ----------------------------------------------------------------------------------------------------
# Distributed


def dist_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun / submitit-exported env; (0, 1, 0) when absent."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))


def init_distributed() -> tuple[int, int, torch.device]:
    rank, world, local = dist_env()
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not torch.distributed.is_initialized():
        # EAGLE_BATCH_DIST_INIT (file://...): the rendezvous of run_local's ranks; else env:// (torchrun, Slurm).
        torch.distributed.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=os.environ.get("EAGLE_BATCH_DIST_INIT") or None,
            rank=rank,
            world_size=world,
        )
    return rank, world, device


def shutdown_distributed() -> None:
    """Tear the process group down before the rank's process exits. Left to the interpreter's exit, gloo's
    worker threads were sometimes still joinable when its destructor ran: std::terminate, SIGABRT, and
    a failed rank after a finished run (seen once in a clean-clone CI run, 2 CPU ranks; not reproduced in
    15 runs beside a busy core, so the link is likely, not proven)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(t)
    return t


# ----------------------------------------------------------------------------------------------------
# Loss


def ttt_loss(
    model: Eagle3Draft, head: TargetHead, batch: dict, ttt_steps: int, decay: float, autocast: bool
) -> tuple[torch.Tensor, dict]:
    """Unrolled TTT loss on one padded batch. Returns (weighted loss, per-step stats tensors)."""
    ids, lm = batch["input_ids"], batch["loss_mask"].bool()
    b, t = ids.shape
    device = ids.device
    # Target distributions only where some step has a loss: positions p with loss_mask[p+1] == 1.
    need = torch.zeros(b, t, dtype=torch.bool, device=device)
    need[:, :-1] = lm[:, 1:]
    tgt_logp = torch.zeros(b, t, model.cfg.draft_vocab_size, device=device)
    tgt_arg = torch.full((b, t), -1, dtype=torch.long, device=device)
    if need.any():
        lp, am = head(batch["last"][need])
        tgt_logp[need] = lp
        tgt_arg[need] = am
    d2t_ids = model.draft_to_target
    positions = torch.arange(t, device=device).expand(b, t)
    ids_per_step = []
    for s in range(ttt_steps):
        x = torch.zeros_like(ids)
        if s + 1 < t:
            x[:, : t - s - 1] = ids[:, s + 1 :]
        ids_per_step.append(x)
    aux = batch["aux"] if autocast else batch["aux"].float()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(aux, ids_per_step, positions)
    total = torch.zeros((), device=device)
    loss_sum = torch.zeros(ttt_steps, device=device)
    correct = torch.zeros(ttt_steps, device=device)
    count = torch.zeros(ttt_steps, device=device)
    for s, lg in enumerate(logits):
        n = t - s - 2
        if n <= 0:
            continue
        valid = lm[:, s + 2 :]  # predicted token j = i+s+2
        if not valid.any():
            continue
        lg_v = lg[:, :n][valid].float()
        tp = tgt_logp[:, s + 1 : t - 1][valid]
        ta = tgt_arg[:, s + 1 : t - 1][valid]
        logq = F.log_softmax(lg_v, dim=-1)
        per_tok = -(tp.exp() * logq).sum(-1)
        step_loss = per_tok.mean()
        total = total + (decay**s) * step_loss
        loss_sum[s] = per_tok.detach().sum()
        correct[s] = (d2t_ids[lg_v.argmax(-1)] == ta).float().sum()
        count[s] = valid.sum()
    if not total.requires_grad:  # no loss token in the batch: keep the graph so backward (and DDP) runs
        total = total + 0.0 * sum(lg.float().sum() for lg in logits)
    return total, {"loss_sum": loss_sum, "correct": correct, "count": count}


# ----------------------------------------------------------------------------------------------------
# Schedule, RNG, checkpoints


def lr_lambda(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def latest_checkpoint(out_dir: Path) -> Path | None:
    p = out_dir / "checkpoints" / "latest"
    if not p.is_file():
        return None
    ck = out_dir / "checkpoints" / p.read_text().strip()
    return ck if ck.is_file() else None


def save_checkpoint(out_dir: Path, state: dict, keep: int = 2) -> Path:
    d = out_dir / "checkpoints"
    d.mkdir(parents=True, exist_ok=True)
    name = f"step-{state['step']:08d}.pt"
    tmp = d / (name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, d / name)
    (d / "latest.tmp").write_text(name + "\n")
    os.replace(d / "latest.tmp", d / "latest")
    for old in sorted(d.glob("step-*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
    return d / name


# ----------------------------------------------------------------------------------------------------
# Metrics


class Metrics:
    def __init__(self, out_dir: Path, enabled: bool, tensorboard: bool):
        self.enabled = enabled
        self.f = open(out_dir / "metrics.jsonl", "a") if enabled else None
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tb"))
            except Exception as e:  # tensorboard missing: JSONL still has everything
                print(f"[eagle-batch train] TensorBoard disabled: {e}")

    def log(self, rec: dict) -> None:
        if not self.enabled:
            return
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        if self.tb is not None:
            step = rec["step"]
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, step)
                elif isinstance(v, list):
                    for i, x in enumerate(v):
                        self.tb.add_scalar(f"{k}/{i}", x, step)

    def close(self) -> None:
        if self.f:
            self.f.close()
        if self.tb is not None:
            self.tb.close()


# ----------------------------------------------------------------------------------------------------
# Training


def output_dir(cfg) -> Path:
    return Path(cfg.train.output_dir) if cfg.train.output_dir else Path(cfg.run_dir) / "train" / cfg.train.name


def resolve_layers(cfg, stored_layer_ids: list[int]) -> tuple[list[int], int]:
    """(aux layer ids in ascending order, last layer id N): aux = stored ids other than N, or
    train.aux_layer_ids.

    Ascending because that is the order in which vLLM hands the aux states to the draft's fc, whatever the
    order of `eagle_aux_hidden_state_layer_ids` (0.32 sorts the set; 0.26 appends each as its layer loop
    passes it): fc trained on another order would see its input blocks swapped at serving time."""
    from eagle_batch.config import model_info

    n = model_info(cfg.model.path).num_hidden_layers
    aux = list(cfg.train.aux_layer_ids) if cfg.train.aux_layer_ids else [i for i in stored_layer_ids if i != n]
    if n not in stored_layer_ids:
        raise ValueError(
            f"the training data has layers {stored_layer_ids} but not the last layer {n} "
            "(its states give the training targets); re-extract with it in model.layer_ids."
        )
    if len(set(aux)) != len(aux) or n in aux:
        raise ValueError(
            f"train.aux_layer_ids={aux}: list each layer once and leave out the last layer {n} (its state "
            "gives the targets; vLLM never feeds it to the draft)"
        )
    return sorted(aux), n


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
    optimizer step (hooks, tests of the data order).
    """
    tc = cfg.train
    rank, world, device = init_distributed()
    out = output_dir(cfg)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(tc.seed)
    np.random.seed(tc.seed)
    random.seed(tc.seed)

    if dataset is None:
        from eagle_batch.store import open_dataset

        dataset = open_dataset(tc.data or cfg.run_dir)
    if len(dataset) == 0:
        from eagle_batch.store import StoreError

        raise StoreError(
            f"{tc.data or cfg.run_dir} holds no committed samples: there is nothing to train on. "
            f"Check `eagle-batch status {cfg.run_dir}` (did extraction run and finish?), then "
            "`eagle-batch aggregate` again."
        )
    aux_ids, last_id = resolve_layers(cfg, list(dataset.layer_ids))
    samples = TrainSamples(dataset, aux_ids, last_id, tc.max_length)
    plan = BatchPlan(samples.lengths(), tc.batch_tokens, tc.seed, world)
    steps_per_epoch = plan.steps_per_epoch()
    total_steps = tc.epochs * steps_per_epoch if tc.epochs > 0 else tc.steps

    dcfg = draft_config_from_target(
        cfg.model.path,
        aux_ids,
        last_id,
        tc.draft_vocab_size,
        tc.draft_intermediate_size,
        tc.draft_num_heads,
        tc.draft_num_kv_heads,
    )
    th = target_head(cfg.model.path)
    model = Eagle3Draft(dcfg, th["embed"]).to(device)
    ckpt_path = latest_checkpoint(out)
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False) if ckpt_path else None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    else:
        freq = token_frequencies(dataset, dcfg.vocab_size)
        model.set_vocab_map(build_vocab_map(freq, dcfg.draft_vocab_size).to(device))
        if rank == 0:
            covered = float(freq[model.draft_to_target.cpu().numpy()].sum() / max(1, freq.sum()))
            (out / "vocab.json").write_text(
                json.dumps(
                    {
                        "draft_vocab_size": dcfg.draft_vocab_size,
                        "distinct_tokens": int((freq > 0).sum()),
                        "loss_token_coverage": covered,
                    }
                )
                + "\n"
            )
    head = TargetHead(
        th["norm"], th["lm_head"], dcfg.rms_norm_eps, model.draft_to_target.cpu(), full_argmax=tc.accuracy_vs == "full"
    ).to(device)
    del th

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, betas=(0.9, 0.95), weight_decay=tc.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(tc.warmup_steps, total_steps, tc.min_lr_ratio))
    step, epoch, batch_in_epoch = 0, 0, 0
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        step, epoch, batch_in_epoch = ckpt["step"], ckpt["epoch"], ckpt["batch_in_epoch"]
        rngs = ckpt.get("rng", {})
        if str(rank) in rngs:
            set_rng_state(rngs[str(rank)])
        if ckpt.get("world_size", world) != world:
            print(
                f"[eagle-batch train] resuming a {ckpt.get('world_size')}-rank checkpoint on {world} ranks: "
                "the data order after this point differs from the original run"
            )
    ddp = model
    if world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )

    metrics = Metrics(out, rank == 0, tc.tensorboard)
    if rank == 0:
        (out / "draft_config.json").write_text(json.dumps(dcfg.to_json(), indent=2) + "\n")
        metrics.log(
            {
                "event": "start",
                "step": step,
                "resumed_from": str(ckpt_path) if ckpt_path else None,
                "total_steps": total_steps,
                "steps_per_epoch": steps_per_epoch,
                "world_size": world,
                "num_samples": len(samples),
            }
        )
    autocast = tc.precision == "bf16"
    pin = device.type == "cuda"
    status = "done"
    steps_this_run = 0
    t_last = time.perf_counter()
    acc_window: dict[str, Any] = {"wait": 0.0, "compute": 0.0, "tokens": 0, "n": 0}

    def state_dict() -> dict:
        rngs = [None] * world
        mine = rng_state()
        if world > 1:
            torch.distributed.all_gather_object(rngs, mine)
        else:
            rngs = [mine]
        return {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "world_size": world,
            "rng": {str(r): s for r, s in enumerate(rngs)},
            "draft_config": dcfg.to_json(),
            "train_config": asdict(tc),
        }

    def checkpoint() -> None:
        st = state_dict()  # collective: every rank calls it
        if rank == 0:
            save_checkpoint(out, st)

    # An empty epoch raises "no training batches" from the stream's first batch.
    stream = EpochLoader(
        samples, plan, rank, num_workers=tc.num_workers, prefetch_factor=tc.prefetch_factor, pin_memory=pin
    ).stream(epoch, skip=batch_in_epoch)
    t_last = time.perf_counter()
    for epoch, index, batch in stream if step < total_steps else ():
        t_got = time.perf_counter()
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        model.train()
        if world > 1:
            loss, st = _ddp_loss(ddp, model, head, batch, tc, autocast)
        else:
            loss, st = ttt_loss(model, head, batch, tc.ttt_steps, tc.ttt_decay, autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip) if tc.grad_clip > 0 else torch.tensor(0.0)
        opt.step()
        sched.step()
        step += 1
        batch_in_epoch = index + 1
        steps_this_run += 1
        if on_step is not None:
            on_step(step, batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t_done = time.perf_counter()
        acc_window["wait"] += t_got - t_last
        acc_window["compute"] += t_done - t_got
        acc_window["tokens"] += int(batch["lengths"].sum())
        acc_window["n"] += 1
        t_last = t_done
        if step % max(1, tc.log_every) == 0 or step == total_steps or step == 1:
            vec = torch.cat([st["loss_sum"], st["correct"], st["count"]]).detach().float()
            vec = _all_reduce_sum(vec)
            k = tc.ttt_steps
            cnt = vec[2 * k :].clamp_min(1)
            elapsed = acc_window["wait"] + acc_window["compute"]
            metrics.log(
                {
                    "step": step,
                    "epoch": epoch,
                    "lr": sched.get_last_lr()[0],
                    "loss": float(loss.detach()),
                    "loss_per_step": (vec[:k] / cnt).tolist(),
                    "acc_per_step": (vec[k : 2 * k] / cnt).tolist(),
                    "acc": float(vec[k] / cnt[0]),
                    "grad_norm": float(gnorm),
                    "tokens_per_s": acc_window["tokens"] * world / max(elapsed, 1e-9),
                    "data_wait_frac": acc_window["wait"] / max(elapsed, 1e-9),
                    "time": time.time(),
                }
            )
            acc_window = {"wait": 0.0, "compute": 0.0, "tokens": 0, "n": 0}
        stop_now = bool(should_stop()) or (max_steps_this_run and steps_this_run >= max_steps_this_run)
        if world > 1:
            flag = _all_reduce_sum(torch.tensor([1.0 if stop_now else 0.0], device=device))
            stop_now = bool(flag.item() > 0)
        if step % max(1, tc.checkpoint_every) == 0 or stop_now or step == total_steps:
            checkpoint()
        if stop_now and step < total_steps:
            status = "stopped"
            break
        if step >= total_steps:
            break
    stream.close()

    result = {"status": status, "step": step, "total_steps": total_steps, "out_dir": str(out)}
    if status == "done" and rank == 0 and tc.export:
        export_dir = export_draft(model, out / "export")
        result["export_dir"] = str(export_dir)
        (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    metrics.log({"event": status, "step": step})
    metrics.close()
    if world > 1:
        torch.distributed.barrier()
    return result


def _ddp_loss(ddp, model, head, batch, tc, autocast):
    """The same loss through the DDP wrapper (its forward hooks do the gradient all-reduce)."""

    class _Proxy:
        cfg = model.cfg
        draft_to_target = model.draft_to_target

        def __call__(self, *a, **k):
            return ddp(*a, **k)

    return ttt_loss(_Proxy(), head, batch, tc.ttt_steps, tc.ttt_decay, autocast)

"""Where a training step's time goes: a few steps of the real trainer under torch.profiler.

    PYTHONPATH=. python lab/train_step_probe.py CONFIG run_dir=RUN [key=value ...] [--out DIR] [--json-out FILE]

Runs `eagle_batch.train.trainer.train` on the run's states (the config and overrides as `eagle-batch train`
takes them; export off, output under DIR) for WAIT + WARMUP + ACTIVE steps and profiles the ACTIVE ones
(CPU, and CUDA when there is a GPU). Prints one JSON line: wall seconds per active step, the device's busy
time per step (the sum of its kernels' time) and so its busy fraction, host (CPU) time per step, ops
dispatched per step, and the tokens per second of the active steps (also written to --json-out); then the top
ops by device time and by host time. A busy fraction well below 1 with
a data_wait_frac near 0 says the step is bound by the host (Python, dispatch, launches), not the GPU.
Writes a Chrome trace to DIR/trace.json.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from eagle_batch.config import load_config
from eagle_batch.train.trainer import train

WAIT, WARMUP, ACTIVE = 5, 3, 6


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--out", default="/tmp/train-step-probe")
    p.add_argument("--json-out", default="", help="also write the JSON record to this file")
    args = p.parse_args(argv)
    out = Path(args.out)
    steps = WAIT + WARMUP + ACTIVE + 1
    cfg = load_config(
        args.config,
        [
            *args.overrides,
            f"train.steps={steps}",
            f"train.output_dir={out / 'train'}",
            "train.export=false",
            "train.tensorboard=false",
            f"train.log_every={steps}",
            f"train.checkpoint_every={steps * 10}",
        ],
    )
    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    stamps: list[float] = []
    tokens: list[int] = []

    def on_step(step: int, batch: dict) -> None:
        if cuda:
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        tokens.append(int(batch["lengths"].sum()))  # after the sync: reads no unfinished work
        prof.step()

    with profile(activities=acts, schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE)) as prof:
        train(cfg, on_step=on_step)
    prof.export_chrome_trace(str(out / "trace.json"))
    events = prof.key_averages()
    first = WAIT + WARMUP  # stamps[i] is the end of step i + 1
    wall = (stamps[first + ACTIVE - 1] - stamps[first - 1]) / ACTIVE
    # Kernel events only, as in the profiler's own "Self CUDA time total": an aten op's row repeats the time of
    # the kernels it launched, and the ProfilerStep* annotation spans them all.
    kernels = [
        e
        for e in events
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.key.startswith("ProfilerStep")
    ]
    device_s = sum(e.self_device_time_total for e in kernels) / 1e6 / ACTIVE
    host_s = sum(e.self_cpu_time_total for e in events) / 1e6 / ACTIVE
    ops = sum(e.count for e in events if e.key.startswith("aten::")) / ACTIVE
    active_tokens = sum(tokens[first : first + ACTIVE])  # tokens[i]: the batch of step i + 1
    record = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "batch_tokens": cfg.train.batch_tokens,
        "ttt_steps": cfg.train.ttt_steps,
        "compile": cfg.train.compile,
        "wall_s_per_step": round(wall, 4),
        "tokens_per_s": round(active_tokens / (wall * ACTIVE)),
        "device_busy_s_per_step": round(device_s, 4),
        "device_busy_frac": round(device_s / wall, 3) if cuda else None,
        "host_op_s_per_step": round(host_s, 4),
        "aten_ops_per_step": round(ops),
    }
    print(json.dumps(record))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(record) + "\n")
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=15))
    if cuda:
        print(events.table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main(sys.argv[1:])

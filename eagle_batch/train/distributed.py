"""DDP plumbing of the trainer: rank/world from the environment (torchrun, submitit), process-group set-up
and teardown, and the stop flag every rank must agree on."""

from __future__ import annotations

import torch

from eagle_batch import environment


def dist_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun / submitit-exported env; (0, 1, 0) when absent."""
    r = environment.dist_ranks()
    return r.rank, r.world_size, r.local_rank


def init_distributed() -> tuple[int, int, torch.device]:
    rank, world, local = dist_env()
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not torch.distributed.is_initialized():
        # A file:// rendezvous for run_local's ranks; else env:// (torchrun, Slurm).
        torch.distributed.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=environment.dist_ranks().init_method or None,
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


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(t)
    return t


class StopFlag:
    """Whether to stop after this step; with DDP every rank must stop at the same step.

    One rank's request (SIGUSR2, a step limit) is all-reduced after step k and read after step k+1: the
    read then waits only for that small collective, which the device finished before starting step k+1,
    instead of for all of step k+1. Ranks stop together, one step after one of them asked."""

    def __init__(self, world: int, device: torch.device):
        self.world, self.device = world, device
        self.pending: tuple | None = None

    def __call__(self, local: bool) -> bool:
        if self.world == 1:
            return local
        # torch.full launches a fill; torch.tensor([...], device=cuda) would copy from pageable memory and
        # synchronize the stream.
        flag = torch.full((1,), 1.0 if local else 0.0, device=self.device)
        work = torch.distributed.all_reduce(flag, async_op=True)
        host, event = flag, None
        if self.device.type == "cuda":
            work.wait()  # orders the copy after the collective on the current stream; does not block the host
            host = torch.empty(1, pin_memory=True)
            host.copy_(flag, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            work = None
        previous, self.pending = self.pending, (work, event, host)
        if previous is None:
            return False
        work, event, host = previous
        if work is not None:
            work.wait()
        if event is not None:
            event.synchronize()
        return bool(host[0] > 0)

    def drain(self) -> None:
        """Wait for the last all-reduce still in flight (the loop ended before reading it)."""
        if self.pending is not None:
            work, event, _ = self.pending
            if work is not None:
                work.wait()
            if event is not None:
                event.synchronize()
            self.pending = None

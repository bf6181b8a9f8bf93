"""Data-parallel training over processes with torch.distributed (NCCL between GPUs, gloo on the CPU).

Every process holds the whole model and renders its share of each step's views; the gradients are summed
across the processes before the optimizer step, and so are the densification statistics before each
densification, so every process makes the same update and the same decisions and holds the same model.
A step's views are drawn from the trainer's seeded generator, the same on every process, which is what
makes a run of N processes equal to one process training on the same batches.
"""
from __future__ import annotations

import os
import socket
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class Group:
    """This process's place among the processes training one model; a group of one needs no
    torch.distributed."""

    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = rank, world

    @property
    def leader(self) -> bool:
        """The process that writes checkpoints, models and logs."""
        return self.rank == 0

    def share(self, items: list) -> list:
        """This process's part of a step's items: every world-th, starting at its rank."""
        return items[self.rank::self.world]

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor by its sum over the processes, in one collective call."""
        if self.world == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


SINGLE = Group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(work: Callable[..., None], world: int, device: str, *args) -> None:
    """Run work(group, device, *args) in `world` processes of one host: on GPUs 0..world-1 with NCCL, or
    on the CPU with gloo. Returns once all have finished; raises if one failed."""
    if device == "cuda" and torch.cuda.device_count() < world:
        raise ValueError(f"{world} processes asked for, but {torch.cuda.device_count()} CUDA GPUs are visible")
    mp.start_processes(_run, args=(work, world, device, free_port(), args), nprocs=world, start_method="spawn")


def _run(rank: int, work: Callable[..., None], world: int, device: str, port: int, args: tuple) -> None:
    if device == "cuda":
        torch.cuda.set_device(rank)
    else:  # the processes share the host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    try:
        work(Group(rank, world), f"cuda:{rank}" if device == "cuda" else "cpu", *args)
        # Tear down together: a process whose peer already closed its connections can abort in gloo's
        # destructors ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()

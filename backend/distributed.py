"""Data-parallel training over processes with torch.distributed (NCCL between GPUs, gloo on the CPU).

Every process holds the whole model and renders its share of each step's views; the gradients are summed
across the processes before the optimizer step, and so are the densification statistics before each
densification, so every process makes the same update and the same decisions and holds the same model.
A step's views are drawn from the trainer's seeded generator, the same on every process, which is what
makes a run of N processes equal to one process training on the same batches.

What only one process can know (a signal that asks to stop, the leader's clock for a checkpoint by time) becomes
the group's decision through Group.agree, once a step. A group starts in one of two ways: `launch` spawns its
processes on one host (`train --gpus N`; `serve --gpus N` spawns them with `start` and watches them with
`finished`), or torchrun starts them on one or more hosts and `join_torchrun` joins them through the env://
rendezvous torchrun sets up.
"""
from __future__ import annotations

import os
import signal
import socket
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from blender_addon.core.errors import SplatwrightError

# How long a collective waits for a peer before the group gives up (a peer that hangs rather than dies).
TIMEOUT = timedelta(minutes=10)


class Group:
    """This process's place among the processes training one model; a group of one needs no
    torch.distributed. `device` is where its collectives' tensors live (NCCL takes CUDA tensors only)."""

    def __init__(self, rank: int = 0, world: int = 1, device: str | torch.device = "cpu"):
        self.rank, self.world, self.device = rank, world, torch.device(device)
        self.sent = 0  # bytes this process has put into collectives

    @property
    def leader(self) -> bool:
        """The process that writes checkpoints, models and logs, and whose clock decides a checkpoint by time."""
        return self.rank == 0

    def share(self, items: list) -> list:
        """This process's part of a step's items: every world-th, starting at its rank."""
        return items[self.rank::self.world]

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor by its sum over the processes, in one collective call."""
        if self.world == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self.sent += flat.numel() * flat.element_size()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Every process's `rows` (a count of its own of the same trailing shape and dtype), by rank."""
        if self.world == 1:
            return [rows]
        count = torch.tensor([rows.shape[0]], dtype=torch.int64, device=self.device)
        counts = [torch.zeros_like(count) for _ in range(self.world)]
        dist.all_gather(counts, count)
        sizes = [int(c) for c in counts]
        padded = rows.new_zeros((max(sizes),) + rows.shape[1:])
        padded[:len(rows)] = rows
        out = [torch.empty_like(padded) for _ in range(self.world)]
        self.sent += count.element_size() + rows.numel() * rows.element_size()
        dist.all_gather(out, padded)
        return [o[:n] for o, n in zip(out, sizes)]

    def broadcast_(self, tensor: torch.Tensor, source: int) -> None:
        """`tensor` on every process becomes the one of process `source`."""
        if self.world == 1:
            return
        if self.rank == source:
            self.sent += tensor.numel() * tensor.element_size()
        dist.broadcast(tensor, source)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def agree(self, flags: list[bool]) -> list[bool]:
        """The group's decisions: each flag true on every process where any process has it true. A decision
        only the leader makes (a checkpoint by its clock) is one the other processes pass as False."""
        if self.world == 1:
            return list(flags)
        t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=self.device)
        self.sent += t.numel() * t.element_size()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [bool(v) for v in t.tolist()]


SINGLE = Group()


def backend_for(device: str | torch.device) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_gpus(world: int, device: str) -> str:
    """The device kind `world` processes of one host train on ('cuda' or 'cpu') for --device auto|cpu|cuda;
    a SplatwrightError saying what is needed where this host has too few GPUs."""
    if device == "cpu":
        return "cpu"
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < world:
        raise SplatwrightError(f"--gpus {world}: needs {world} CUDA GPUs, and torch sees {found or 'none'}; "
                               f"add --device cpu to train in {world} processes on the CPU")
    return "cuda"


def under_torchrun() -> bool:
    """Whether torchrun (or another launcher of the env:// rendezvous) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or {"RANK", "WORLD_SIZE", "MASTER_ADDR"} <= os.environ.keys()


def restarted_by_torchrun() -> bool:
    """Whether torchrun started this process again after a process of its group failed (--max-restarts)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def join_torchrun(device: str) -> Group:
    """This process's group under torchrun: its rank and the world from torchrun's environment, on its local
    GPU (LOCAL_RANK) or the CPU (device 'cuda' or 'cpu')."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
        place = f"cuda:{local}"
    else:
        place = "cpu"
        share_cores(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    dist.init_process_group(backend_for(place), init_method="env://", rank=rank, world_size=world, timeout=TIMEOUT)
    return Group(rank, world, place)


def leave(group: Group) -> None:
    """Tear the group down together: a process whose peer already closed its connections can abort in gloo's
    destructors ("terminate called without an active exception")."""
    if group.world > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def share_cores(processes: int) -> None:
    """CPU processes of one host share its cores instead of each taking all of them."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // processes))


def start(work: Callable[..., None], world: int, device: str, *args) -> mp.ProcessContext:
    """Start work(group, device, *args) in `world` processes of one host: on GPUs 0..world-1 with NCCL, or on the
    CPU with gloo; `finished` tells when they are done."""
    if device == "cuda" and torch.cuda.device_count() < world:
        raise ValueError(f"{world} processes asked for, but {torch.cuda.device_count()} CUDA GPUs are visible")
    return mp.start_processes(_run, args=(work, world, device, free_port(), args), nprocs=world,
                              start_method="spawn", join=False)


def finished(context: mp.ProcessContext, timeout: float | None = None, advice: str = "") -> bool:
    """Whether all the processes `start` started have finished, waiting up to `timeout` seconds (None: until one
    ends). A process that fails or dies ends the others, and a SplatwrightError names it and the reason, followed
    by `advice` after a death."""
    world = len(context.processes)
    try:
        return context.join(timeout)
    except mp.ProcessExitedException as e:
        raise died(e.error_index, world, e.exit_code, advice) from None
    except mp.ProcessRaisedException as e:
        # A peer of a process that died can fail first, in a collective: the death is the reason.
        dead = [(i, p.exitcode) for i, p in enumerate(context.processes)
                if p.exitcode is not None and p.exitcode < 0 and p.exitcode != -signal.SIGTERM]
        if dead:
            raise died(*dead[0], world, advice) from None
        raise SplatwrightError(f"process {e.error_index} of {world} failed: {raised(e.msg)}") from None


def launch(work: Callable[..., None], world: int, device: str, *args) -> bool:
    """Run work(group, device, *args) in `world` processes of one host (`start`). Returns once all have finished:
    whether Ctrl-C came meanwhile (it reaches every process, and the work decides what it does; this process
    waits for them). A process that fails or dies ends the others, and a SplatwrightError names it and the
    reason."""
    context = start(work, world, device, *args)
    interrupted = []
    waiting = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        while not finished(context, advice="resume from its last checkpoint with --resume"):
            pass
        return bool(interrupted)
    finally:
        signal.signal(signal.SIGINT, waiting)


def died(index: int, world: int, exit_code: int, advice: str) -> SplatwrightError:
    how = (f"was killed by {signal.Signals(-exit_code).name}" if exit_code < 0 else f"exited with code {exit_code}")
    return SplatwrightError(f"process {index} of {world} {how}, which ended the training" +
                            (f"; {advice}" if advice else ""))


def raised(traceback_text: str) -> str:
    """The error a process's traceback ends with: a SplatwrightError's message alone, else `Type: message`."""
    last = [line for line in traceback_text.strip().splitlines() if line.strip()][-1]
    prefix = f"{SplatwrightError.__module__}.{SplatwrightError.__qualname__}: "
    return last[len(prefix):] if last.startswith(prefix) else last


def _run(rank: int, work: Callable[..., None], world: int, device: str, port: int, args: tuple) -> None:
    if device == "cuda":
        torch.cuda.set_device(rank)
        place = f"cuda:{rank}"
    else:
        share_cores(world)
        place = "cpu"
    dist.init_process_group(backend_for(place), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=TIMEOUT)
    group = Group(rank, world, place)
    try:
        work(group, place, *args)
        leave(group)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

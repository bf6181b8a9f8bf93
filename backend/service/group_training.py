"""`serve --gpus N`: the open session's training in N processes of this host (backend/distributed.py), while the
server's own process keeps answering requests and drawing frames.

A run of the group starts from the server's trainer (its state_dict, as a checkpoint holds it) and lasts while the
engine's state is training: pause and stop end it after the step under way, as does the end of the schedule. Its
leader sends the server process the whole model's parameters every progress interval, which the server's trainer
then shows (renders, status, exports follow the training), and its whole state at the end, which becomes the
server's trainer: a paused, stopped or finished session's model in the server is the group's exactly, and resume
starts a new run from it. The group writes the session's periodic checkpoints; a process that dies ends the run
and the session goes back to its last checkpoint (Training._fail).
"""
from __future__ import annotations

import io
import multiprocessing
import queue
import signal
import time
from dataclasses import replace

import torch

from blender_addon.core.errors import SplatwrightError
from ..data.dataset import Dataset
from ..distributed import Group, finished, start
from ..dynamic import gaussians_from_tensors
from ..train import TrainConfig, Trainer

POLL_SECONDS = 0.1  # how often the server looks at the group's messages and at its state


def to_bytes(value) -> bytes:
    """Tensors sent between the processes as bytes: a queue's tensors in shared memory would need their sender
    alive until they are read, and the leader ends right after its last message."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


def train_session(group: Group, device: str, state: bytes, data: Dataset, rasterizer: str, parallel: str,
                  settings: dict, checkpoint: str, stop, outbox) -> None:
    """One process of a run (distributed.start): train on from `state` (a state_dict's bytes) until the schedule
    ends or the server sets `stop`, checkpointing to `checkpoint` as `settings` say. The leader puts into `outbox`
    ("note", Trainer.note: how it trains otherwise than asked), ("model", parameters and progress) every progress
    interval, ("checkpoint", step) after each checkpoint, ("warning", text) and, last, ("end", the state_dict)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the server, which stops the group
    state = from_bytes(state)
    cfg = replace(TrainConfig.from_dict(state["config"]), rasterizer=rasterizer, parallel=parallel)
    trainer = Trainer.from_checkpoint(data, state, device, cfg, group)
    if group.leader:
        outbox.put(("note", trainer.note))
    parent = multiprocessing.parent_process()
    shared_at, orphaned = time.monotonic(), False
    while trainer.step < trainer.cfg.iterations:
        trainer.train_step()
        due = trainer.checkpoint_due(settings["checkpoint_every"], settings["checkpoint_seconds"])
        share = group.leader and time.monotonic() - shared_at >= settings["progress_interval"]
        orphaned = group.leader and not parent.is_alive()
        due, share, stopping, orphaned = group.agree([due, share, stop.is_set() or orphaned, orphaned])
        if due or orphaned:  # a server that died leaves the group's last step on the disk
            try:
                trainer.save_checkpoint(checkpoint)
                if group.leader:
                    outbox.put(("checkpoint", trainer.step))
            except SplatwrightError as e:  # the leader's write failed: training goes on without it
                outbox.put(("warning", f"{e}; training goes on without it"))
        if stopping:
            break
        if share:
            model = trainer.whole_model()  # every process takes part
            if group.leader:
                outbox.put(("model", to_bytes({"step": trainer.step, "last": trainer.last, "tensors": {
                    name: t.detach().cpu() for name, t in model.tensors().items()}})))
                shared_at = time.monotonic()
    if orphaned:  # nobody reads what the queue still holds: the process ends without sending it
        outbox.cancel_join_thread()
        return
    state = trainer.state_dict()  # every process takes part
    if group.leader:
        outbox.put(("end", to_bytes(state)))


class GroupRun:
    """A run of the group, seen from the server's training thread."""

    def __init__(self, world: int, device: str, parallel: str, trainer: Trainer, rasterizer: str, settings: dict,
                 checkpoint: str):
        spawn = multiprocessing.get_context("spawn")
        self.stop, self.outbox = spawn.Event(), spawn.Queue()
        self.context = start(train_session, world, device, to_bytes(trainer.state_dict()), trainer.data.to("cpu"),
                             rasterizer, parallel, settings, checkpoint, self.stop, self.outbox)

    def messages(self):
        """The group's messages as they come, until its processes have all ended (SplatwrightError: one failed or
        died). Waits POLL_SECONDS at most between yields ((None, None) when nothing came)."""
        done = False
        while not done:
            done = finished(self.context, 0)
            try:
                yield self.outbox.get(timeout=0 if done else POLL_SECONDS)
            except queue.Empty:
                yield None, None
        while True:  # what the leader sent before it ended
            try:
                yield self.outbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                return

    def end(self) -> None:
        """End the processes still running (where the server's side of a run failed)."""
        for process in self.context.processes:
            if process.is_alive():
                process.terminate()
            process.join()


def follow(trainer: Trainer, message: bytes, device: str) -> None:
    """The server's trainer shows the group's model as the leader sent it (its optimizer is not the group's: the
    trainer is replaced by the group's whole state once the run ends)."""
    shared = from_bytes(message)
    trainer.g = gaussians_from_tensors(shared["tensors"]).to(device)
    trainer.step, trainer.last = shared["step"], shared["last"]

"""Frames asked for and waiting to be rendered: a job per request (RenderJob), queued newest-wins per stream."""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np

from blender_addon.core import protocol
from blender_addon.core.cameras import Camera
from .shared_frames import SharedFrames


@dataclass
class RenderJob:
    camera: Camera
    format: str
    depth: bool  # also send the depth plane
    done: Callable[[dict, bytes | memoryview], None]  # reply fields and payload
    fail: Callable[[str, str], None]  # error code and message
    model: str | None = None  # a session whose saved model is drawn (protocol.MODEL_CHOICE); None: the shown one
    crop: np.ndarray | None = None  # model space into the unit cube of the box the drawn Gaussians' centres are in
    time: float | None = None  # when a 4D model is drawn (None: 0)
    stream: Hashable = None  # a newer job of the same stream supersedes this one while it waits
    shared: SharedFrames | None = None  # the connection's shared-memory frames, where the request asked for them
    seq: int = 0


class RenderQueue:
    """Renders waiting their turn, oldest first, at most one of each stream: a newer job supersedes its stream's
    waiting one (a viewer wants its newest view, not every view it had) and goes to the end. The trainer calls
    `let_in` between steps so waiting frames are rendered before the next step starts."""

    def __init__(self):
        self.cond = threading.Condition()
        self.waiting: OrderedDict[Hashable, RenderJob] = OrderedDict()
        self.submitted = 0  # sequence number of the newest job
        self.settled = 0  # newest sequence number rendered (or failed)
        self.closed = False

    def submit(self, job: RenderJob) -> None:
        with self.cond:
            self.submitted += 1
            job.seq = self.submitted
            old = self.waiting.pop(job.stream, None)
            self.waiting[job.stream] = job
            self.cond.notify_all()
        if old is not None:
            old.fail(protocol.SUPERSEDED, "a newer render request replaced this one before it started")

    def take(self) -> RenderJob | None:
        """The next job, or None once closed."""
        with self.cond:
            self.cond.wait_for(lambda: self.waiting or self.closed)
            return None if self.closed else self.waiting.popitem(last=False)[1]

    def settle(self, job: RenderJob) -> None:
        with self.cond:
            self.settled = max(self.settled, job.seq)
            self.cond.notify_all()

    def let_in(self) -> None:
        """Wait until every job submitted so far has been drawn from the model; jobs arriving meanwhile
        wait a step."""
        with self.cond:
            target = self.submitted
            self.cond.wait_for(lambda: self.settled >= target or self.closed)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

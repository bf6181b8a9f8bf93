"""Frames asked for and waiting to be rendered: a job per request (RenderJob), queued newest-wins per stream of a
connection, each connection's waiting jobs capped and dropped when it closes."""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np

from blender_addon.core import protocol
from blender_addon.core.cameras import Camera
from .limits import Limits
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
    owner: Hashable = None  # the connection that asked: its waiting jobs are capped, and dropped when it closes
    stream: int = 0  # a newer job of the same owner and stream supersedes this one while it waits
    shared: SharedFrames | None = None  # the connection's shared-memory frames, where the request asked for them
    seq: int = 0


class RenderQueue:
    """Renders waiting their turn, oldest first. A stream of a connection keeps one job waiting: a newer job
    supersedes it (a viewer wants its newest view, not every view it had) and goes to the end. A connection may
    have `limits.queued_renders` jobs waiting over all its streams; one more on another stream is refused, and a
    closed connection's waiting jobs are dropped (`drop`). The trainer calls `let_in` between steps so waiting
    frames are rendered before the next step starts."""

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.cond = threading.Condition()
        self.waiting: OrderedDict[tuple[Hashable, int], RenderJob] = OrderedDict()  # by (owner, stream)
        self.taken: set[int] = set()  # sequence numbers of the jobs taken whose copy of the model is not made yet
        self.submitted = 0  # sequence number of the newest job
        self.rendered = 0  # jobs rendered and answered since the server started
        self.closed = False

    def submit(self, job: RenderJob) -> None:
        """Queue `job`; SplatwrightError (naming the cap) when its connection has as many jobs waiting as it may
        and its stream has none of them."""
        key = (job.owner, job.stream)
        with self.cond:
            if key not in self.waiting:
                waiting = sum(1 for owner, _ in self.waiting if owner == job.owner)
                self.limits.check("queued_renders", waiting + 1, "renders of this connection waiting, with this one",
                                  instead="wait for their replies, or ask on a stream that has one waiting (the newer "
                                  "request replaces it)")
            self.submitted += 1
            job.seq = self.submitted
            old = self.waiting.pop(key, None)
            self.waiting[key] = job
            self.cond.notify_all()
        if old is not None:
            old.fail(protocol.SUPERSEDED, "a newer render request of the same stream replaced this one before it "
                     "started (a stream keeps only its newest request waiting)")

    def take(self) -> RenderJob | None:
        """The next job, or None once closed."""
        with self.cond:
            self.cond.wait_for(lambda: self.waiting or self.closed)
            if self.closed:
                return None
            job = self.waiting.popitem(last=False)[1]
            self.taken.add(job.seq)
            return job

    def settle(self, job: RenderJob) -> None:
        """`job` has its copy of the model (or failed): training may step again as far as it is concerned."""
        with self.cond:
            self.taken.discard(job.seq)
            self.cond.notify_all()

    def count_rendered(self) -> None:
        with self.cond:
            self.rendered += 1

    def drop(self, owner: Hashable) -> int:
        """Forget the waiting jobs of `owner` (a closed connection: nobody waits for them); how many there were."""
        with self.cond:
            keys = [key for key in self.waiting if key[0] == owner]
            for key in keys:
                del self.waiting[key]
            self.cond.notify_all()
        return len(keys)

    def let_in(self) -> None:
        """Wait until every job submitted so far has been drawn from the model or dropped; jobs arriving
        meanwhile wait a step."""
        with self.cond:
            target = self.submitted
            self.cond.wait_for(lambda: self.closed or self._oldest() > target)

    def _oldest(self) -> float:
        """The sequence number of the oldest job waiting or taken without its copy of the model yet."""
        return min((*self.taken, *(job.seq for job in self.waiting.values())), default=math.inf)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

"""The render thread: frames of the jobs in a RenderQueue, drawn one at a time from a copy of the model each asks
for, on a stream of their own on the GPU."""
from __future__ import annotations

import threading
import traceback
from dataclasses import replace

import torch

from blender_addon.core import protocol
from blender_addon.core.errors import SplatwrightError
from ..dynamic import DynamicGaussians
from ..placement import chosen
from ..render import camera_tensors
from .frames import QueuedFrame, finish_frame, queue_frame
from .limits import Limits
from .render_queue import RenderJob, RenderQueue
from .saved_models import SavedModels
from .shown import Model, Shown
from .training import TrainingCopies

RENDER_PRIORITY = -100  # of the render stream; torch maps it to the highest priority the GPU has


class Renderer:
    """Renders the jobs submitted, oldest first, on its own thread: the shown model (`shown`), a session's saved
    model (`saved`), or while training runs watched a finished copy of the training model (`copies`)."""

    def __init__(self, shown: Shown, saved: SavedModels, copies: TrainingCopies, limits: Limits, device: str,
                 rasterizer: str):
        self.shown, self.saved, self.copies, self.limits = shown, saved, copies, limits
        self.device, self.rasterizer = device, rasterizer
        self.queue = RenderQueue(limits)
        # Frames render on their own stream, ahead of training's queued kernels (_draw says why that is safe).
        self.stream = torch.cuda.Stream(priority=RENDER_PRIORITY) if device == "cuda" else None
        self.thread = threading.Thread(target=self._render_loop, name="render", daemon=True)
        self.thread.start()

    def submit(self, job: RenderJob) -> None:
        camera = job.camera
        try:
            self.limits.check("render_pixels", camera.width * camera.height, f"the {camera.width}x{camera.height} "
                              "frame")
            self.queue.submit(job)
        except SplatwrightError as e:
            job.fail(protocol.REJECTED, str(e))

    def close(self, wait: float) -> bool:
        """Stop the render thread; returns whether it ended within `wait` seconds."""
        self.queue.close()
        self.thread.join(timeout=wait)
        return not self.thread.is_alive()

    def _render_loop(self) -> None:
        if self.stream is not None:
            torch.cuda.set_stream(self.stream)  # this thread's current stream from now on
        while (job := self.queue.take()) is not None:
            frame = None
            try:
                fields, frame = self._draw(job)
                placed, payload = finish_frame(frame)
                if frame.slot is not None:
                    frame.slot.owner.sent(frame.slot.index)
                job.done({**fields, **placed}, payload)
                frame = None
                self.queue.count_rendered()
            except SplatwrightError as e:
                job.fail(protocol.REJECTED, str(e))
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                job.fail(protocol.OUT_OF_MEMORY, f"the GPU ran out of memory rendering {job.camera.width}x"
                         f"{job.camera.height}; ask for a smaller frame")
            except Exception as e:  # a bug; the next frame may well work
                traceback.print_exc()
                job.fail(protocol.INTERNAL, f"rendering failed: {e!r}; see the backend's log")
            finally:
                if frame is not None and frame.slot is not None:  # not sent: the slot is free again
                    frame.slot.owner.discard(frame.slot.index)
                self.queue.settle(job)

    def _draw(self, job: RenderJob) -> tuple[dict, QueuedFrame]:
        """The render reply's fields and the queued frame, drawn from a copy of the model taken under the model
        lock, so training and requests go on while it renders. The job is settled (training may take its next
        step) once the copy is taken.

        On the GPU this thread works on the high-priority render stream. While training runs watched, the copy is
        one the training thread made after a recent step and the GPU has finished (TrainingCopies). Otherwise it is
        queued on the render stream, after what the default stream (training's, and the requests' uploads) has
        queued so far: it reads the model as the last step left it. The default stream then waits for that copy
        before anything queued later, so no later in-place update can tear it, and memory freed by a later step
        (densification replaces the model's tensors) is reused, on the stream it was allocated on, only after the
        copy read it. The render itself reads only the copy and this stream's own tensors, so its kernels may pass
        training's queued ones."""
        camera = job.camera
        view = camera_tensors(camera, self.device)
        with torch.no_grad():
            with self.shown.lock:
                model = self.shown.live_model(job.model)
                if model is not None:
                    model = self._copied(model)
            self.queue.settle(job)
            if model is None:  # a saved model, loaded here when it is not yet: training goes on meanwhile
                model = self.saved.get(job.model)
            frame = queue_frame(chosen(model.g, job.crop, job.time), camera, model.sh_degree, model.background,
                                self.rasterizer, view, job.format, job.depth, job.shared, model.formation)
        fields = {"width": camera.width, "height": camera.height, "format": frame.format, "step": model.step,
                  "dynamic": isinstance(model.g, DynamicGaussians),
                  "sh_degree": model.sh_degree, "background": [float(c) for c in model.background]}
        return fields, frame

    def _copied(self, model: Model) -> Model:
        """A copy of `model` to render from (_draw says why): on the GPU, while a live view watches training, a
        finished one the training thread made (TrainingCopies)."""
        if self.stream is None:
            return replace(model, g=model.g.detached())
        copy = self.copies.finished(self.shown.trainer) if model.trained else None
        if copy is not None:
            # Made on training's stream: once freed, its memory waits for the render stream's work queued by then.
            for tensor in copy.g.tensors().values():
                tensor.record_stream(self.stream)
            return copy
        training = torch.cuda.default_stream()
        self.stream.wait_stream(training)
        g = model.g.detached()
        # The render stream holds nothing else now (the last frame's copy to the host was waited for), so training
        # waits for the copy alone.
        training.wait_stream(self.stream)
        return replace(model, g=g)

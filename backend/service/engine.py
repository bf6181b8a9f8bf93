"""The engine behind the server: the open session and its model (shown.py), the training thread and the states it
goes through (training.py, protocol.STATES), the render thread (renderer.py), sessions' saved models
(saved_models.py), exports (exports.py) and structure from motion of the client's photos (reconstruction.py). Its
methods answer the server's requests with reply fields and raise SplatwrightError with a message for the user; it
knows nothing about sockets."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from blender_addon.core import protocol
from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from ..formats.ply import read_ply
from ..policy import system_report
from .exports import Exports
from .frames import view_rgb
from .limits import Limits
from .reconstruction import Reconstructions
from .render_queue import RenderJob
from .renderer import Renderer
from .saved_models import SavedModels, file_model
from .session import Session, imported_sessions
from .shown import Shown
from .training import Training, TrainingCopies

LISTED_UNUSED = 8  # imported sessions a refused import names for removal


class Engine:
    """The model of the open session (its trainer) or a model file loaded for viewing, a training thread and a
    render thread. Methods return reply fields and raise SplatwrightError with a message for the user."""

    def __init__(self, workdir: Path, device: str, rasterizer: str, limits: Limits = Limits(), processes: int = 1,
                 parallel: str = "data"):
        self.workdir, self.device, self.rasterizer, self.limits = workdir, device, rasterizer, limits
        self.emit: Callable[[dict], None] = lambda event: None  # the server points this at its client
        self.shown = Shown()
        self.saved = SavedModels(workdir, device, limits.budget())
        self.training_copies = TrainingCopies()
        self.renderer = Renderer(self.shown, self.saved, self.training_copies, limits, device, rasterizer)
        # Training's events go wherever emit points when they happen.
        self.training = Training(self.shown, limits, device, rasterizer, self.training_copies, self.renderer.queue,
                                 lambda event: self.emit(event), processes, parallel)
        self.exports = Exports(self.shown, self.saved)
        self.reconstructions = Reconstructions(workdir, limits, lambda event: self.emit(event))
        self._capabilities: dict | None = None

    # ---- status and capabilities ----

    def status(self) -> dict:
        return self.training.status()

    def capabilities(self) -> dict:
        if self._capabilities is None:
            report = {**system_report(), "numpy": np.__version__, "protocol": protocol.PROTOCOL_VERSION,
                      "device": self.device, "rasterizer": self.rasterizer}
            self._capabilities = report
        return self._capabilities

    # ---- sessions and their data ----

    def open_session(self, name: str, create: bool) -> dict:
        session = self.shown.session
        if session is not None and session.name == name:
            return self.status()  # already open, e.g. a client reconnecting to the session it left training
        if self.training.running():
            raise SplatwrightError(f"session {session.name!r} is training; stop it before opening another")
        self.training.show(Session.open(self.workdir, name, create))
        return self.status()

    def load_ply(self, data: bytes, background, name: str = "", spz_axes: str = "ply") -> dict:
        """Show the splat file `data` (any format, told by its content; `name`, its file name, tells a .splat; an
        SPZ that does not say its axes read in `spz_axes`), or a 4D model's file (splats4d.pt: a *.pt name or a torch file's content), drawn at each request's
        time. The file is kept in a new session named after it, which opens: a splat object can place that
        session's model in a scene, and renders naming it draw it after a restart too."""
        if self.training.running():
            raise SplatwrightError("training is running; stop it before loading a model to view")
        self._check_imported_sessions(name)
        data = bytes(data)
        # A file that cannot be read, or holds a model validate.py refuses, makes no session.
        model = file_model(data, name, background, self.device, self.limits.budget(), spz_axes)
        session = Session.create_imported(self.workdir, name, data, background, spz_axes)
        self.training.show(session, model)
        # and the status says whether it is 4D
        return {"gaussians": len(model.g), "sh_degree": model.g.max_sh_degree, "session": session.name}

    def _check_imported_sessions(self, name: str) -> None:
        """Refuse an import that would keep more imported sessions on the disk than --max-imported-sessions allows,
        listing the least recently used of those neither open nor drawn lately, for the user to remove."""
        imported = imported_sessions(self.workdir)
        if len(imported) < self.limits.imported_sessions:
            return
        in_use = set(self.saved.loaded()) | {self.shown.session.name if self.shown.session else None}
        unused = [session for session in imported if session not in in_use]
        instead = ""
        if unused:
            more = f" and {len(unused) - LISTED_UNUSED} more" if len(unused) > LISTED_UNUSED else ""
            instead = (f"remove from the backend's sessions folder the folders of the least recently used ones that "
                       f"are neither open nor drawn lately ({', '.join(unused[:LISTED_UNUSED])}{more}; the oldest "
                       "first)")
        self.limits.check("imported_sessions", len(imported) + 1,
                          f"importing {name or 'a model'}: imported sessions with its own", instead)

    def check_view(self, camera: Camera) -> None:
        """Refuse a view over the limits before its image is decoded."""
        session = self.shown.require_session()
        self.limits.check("views", len(session.cameras) + 1, "views in the session")
        self.limits.check("view_pixels", camera.width * camera.height, f"the {camera.width}x{camera.height} view")
        self.limits.check("session_pixels", session.pixels + camera.width * camera.height,
                          "pixels of the session's views with this one")

    def add_view(self, camera: Camera, image: np.ndarray, name: str, time: float | None = None) -> dict:
        session = self.shown.require_session()
        self.check_view(camera)
        with self.shown.lock:
            index = session.add_view(camera, image, name, time)
            trainer = self.shown.trainer
            if trainer is not None:
                trainer.add_view(camera, view_rgb(image, trainer.cfg.background), session.names[index], time or 0.0)
        return {"index": index, "views": index + 1}

    def set_points(self, xyz: np.ndarray, rgb: np.ndarray) -> dict:
        """Stores them only: the Gaussians are made from them (a neighbour search) when training starts, on the
        training thread."""
        session = self.shown.require_session()
        self.limits.check("points", len(xyz), "initial points")
        with self.shown.lock:
            session.set_points(xyz, rgb)
        return {"points": len(xyz), "note": "used when training starts from scratch"}

    # ---- training (training.py) ----

    def start_training(self, fields: dict, model: bytes = b"") -> dict:
        """Start or continue training; `model`, a 3DGS PLY (read against the budget of every upload), replaces the
        session's model that training continues from."""
        sent = read_ply(bytes(model), "the model to continue from", self.limits.budget()) if model else None
        return self.training.start(fields, sent)

    def resume(self) -> dict:
        return self.training.resume()

    def pause(self) -> dict:
        return self.training.pause()

    def stop(self) -> dict:
        return self.training.stop()

    def save_checkpoint(self) -> dict:
        return self.training.save_checkpoint()

    def load_checkpoint(self) -> dict:
        return self.training.load_checkpoint()

    # ---- frames and exports ----

    def submit_render(self, job: RenderJob) -> None:
        self.renderer.submit(job)

    def drop_renders(self, owner) -> int:
        """Forget the renders `owner` (a closed connection) has waiting; how many there were."""
        return self.renderer.queue.drop(owner)

    def export_ply(self, name: str = "splats.ply", model: str | None = None, crop: np.ndarray | None = None,
                   time: float | None = None, placement: np.ndarray | None = None,
                   motion: bool = False) -> tuple[dict, bytes]:
        return self.exports.export(name, model, crop, time, placement, motion)

    def close(self, render_wait: float = 0.2) -> bool:
        """Stop training (with a checkpoint) and the render thread; returns whether the render thread ended
        within `render_wait` seconds (a long CPU render cannot be interrupted: the process then exits without
        waiting for it)."""
        self.stop()
        self.reconstructions.close(wait=5.0)
        return self.renderer.close(render_wait)

"""Session storage: a folder under the server's workdir holding what a client sent (views, initial points),
the training settings and checkpoint, so a restarted server can reopen it and go on as before."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch

from blender_addon.core import codecs
from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import write_atomic
from blender_addon.core.points import POINTS_FILE, read_points, write_points
from blender_addon.core.settings import TRAINING
from .data import Dataset
from .frames import view_rgb
from .policy import CHECKPOINT

SESSION_FORMAT = 2  # 2: initial points as points3d.ply (blender_addon/core/points.py); checkpoints of format 2


class Session:
    """Layout: session.json (format, name, and the training settings once training started);
    views/NNNNNN.npy (image as uploaded, rows top-down) and views/NNNNNN.json (camera, name), the .json
    written last so a view exists once it does; points3d.ply; checkpoint.pt; splats.ply. Every file is
    replaced atomically."""

    def __init__(self, folder: Path, name: str):
        self.folder, self.name = folder, name
        self.cameras: list[Camera] = []
        self.images: list[np.ndarray] = []
        self.names: list[str] = []
        self.points: tuple[np.ndarray, np.ndarray] | None = None
        self.settings: dict | None = None  # the training settings of the last start (settings.TRAINING)

    @property
    def checkpoint_path(self) -> Path:
        return self.folder / CHECKPOINT

    @property
    def meta_path(self) -> Path:
        return self.folder / "session.json"

    @classmethod
    def open(cls, workdir: Path, name: str, create: bool) -> "Session":
        folder = workdir / name
        session = cls(folder, name)
        if not folder.exists():
            if not create:
                raise SplatwrightError(f"no session {name!r} in {workdir}; open it with create=true to make one")
            (folder / "views").mkdir(parents=True)
            session._write_meta()
            return session
        try:
            meta = json.loads(session.meta_path.read_text())
        except (OSError, ValueError) as e:
            raise SplatwrightError(f"{folder} is not a readable session folder ({e})") from None
        if meta.get("format") != SESSION_FORMAT:
            raise SplatwrightError(f"{folder}: session format {meta.get('format')}, this backend reads "
                                   f"{SESSION_FORMAT}")
        if meta.get("settings") is not None:
            try:
                session.settings = TRAINING.check(meta["settings"])
            except ValueError as e:
                raise SplatwrightError(f"{session.meta_path}: bad training settings ({e})") from None
        for camera_file in sorted((folder / "views").glob("*.json")):
            try:
                view = json.loads(camera_file.read_text())
                image = np.load(camera_file.with_suffix(".npy"), allow_pickle=False)
                name = str(view.pop("name"))
                camera = codecs.camera_from_wire(view)
            except (OSError, ValueError, KeyError) as e:
                raise SplatwrightError(f"{camera_file}: unreadable view ({e}); remove it and its .npy") from None
            session.cameras.append(camera)
            session.images.append(image)
            session.names.append(name)
        if (folder / POINTS_FILE).is_file():
            session.points = read_points(folder / POINTS_FILE)
        return session

    def _write_meta(self) -> None:
        meta = {"format": SESSION_FORMAT, "name": self.name, "settings": self.settings}
        write_atomic(self.meta_path, json.dumps(meta).encode())

    def save_settings(self, settings: dict) -> None:
        self.settings = settings
        self._write_meta()

    def add_view(self, camera: Camera, image: np.ndarray, name: str) -> int:
        if self.cameras:
            first = self.cameras[0]
            if (camera.width, camera.height) != (first.width, first.height):
                raise SplatwrightError(f"the view is {camera.width}x{camera.height} but this session's views are "
                                       f"{first.width}x{first.height}; all views of a session share one size")
        index = len(self.cameras)
        name = name or f"view_{index:06d}"
        stem = self.folder / "views" / f"{index:06d}"
        buffer = io.BytesIO()
        np.save(buffer, image, allow_pickle=False)
        write_atomic(stem.with_suffix(".npy"), buffer.getvalue())
        write_atomic(stem.with_suffix(".json"), json.dumps({**codecs.camera_to_wire(camera), "name": name}).encode())
        self.cameras.append(camera)
        self.images.append(image)
        self.names.append(name)
        return index

    def set_points(self, xyz: np.ndarray, rgb: np.ndarray) -> None:
        write_points(self.folder / POINTS_FILE, xyz, rgb)
        self.points = (xyz, rgb)

    def dataset(self, background) -> Dataset:
        images = torch.stack([view_rgb(image, background) for image in self.images])
        return Dataset(list(self.cameras), images, list(self.names))

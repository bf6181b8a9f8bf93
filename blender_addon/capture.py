"""One capture run: plan the views, render them one by one with the scene's own engine, write the dataset and
send each training view to the backend as soon as it is rendered."""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import bpy
import numpy as np
from mathutils import Matrix

from .core.errors import SplatwrightError
from .core.points import POINTS_FILE, write_points
from .dataset import DatasetWriter, fitting_distance, orbit_poses, split_of
from .runtime import Backend
from .scene_io import GEOMETRY, bounds, camera_of, surface_points, visible_geometry

ORBIT_CAMERA = "Splatwright Orbit"


@dataclass
class View:
    name: str
    split: str
    camera: object  # the camera object to render through
    frame: int | None = None  # set this frame first
    matrix: np.ndarray | None = None  # or place the camera here first (Blender camera-to-world)


class Capture:
    def __init__(self, context, backend: Backend | None):
        """`backend`: where to send the views, or None to only write the dataset."""
        self.scene = scene = context.scene
        self.settings = s = scene.splatwright
        self.backend = backend
        self._saved = [(scene, "camera", scene.camera), (scene, "frame_current", scene.frame_current)]
        self._orbit_camera = None
        self.session, self.folder = _new_session(_dataset_root(s.folder))
        self.writer = DatasetWriter(self.folder)
        self.done = 0
        try:
            self.views = self._plan(context)
            if not self.views:
                raise SplatwrightError("no views to capture with these settings")
            self._override_render_settings()
            if s.initial_points:  # kept with the dataset, for Send Views and the command line's train
                xyz, rgb = surface_points(context, s.point_count, s.orbit_seed)
                self.folder.mkdir(parents=True, exist_ok=True)
                write_points(self.folder / POINTS_FILE, xyz, rgb)
            if backend is not None:
                name = s.session = self.session
                backend.call("open_session", lambda c: c.call("open_session", name=name), self._status)
                if s.initial_points:
                    backend.call("set_points", lambda c: c.set_points(xyz, rgb))
        except BaseException:
            self.finish()
            raise

    @property
    def total(self) -> int:
        return len(self.views)

    @property
    def finished(self) -> bool:
        return self.done >= len(self.views)

    def step(self) -> None:
        """Render, store and send the next view (blocks for one render)."""
        view = self.views[self.done]
        scene = self.scene
        if view.frame is not None:
            scene.frame_set(view.frame)
        if view.matrix is not None:
            view.camera.matrix_world = Matrix(view.matrix.tolist())
            bpy.context.view_layer.update()
        scene.camera = view.camera
        cam = camera_of(view.camera, scene)
        path = self.writer.image_path(view.split, view.name)
        scene.render.filepath = str(path)
        bpy.ops.render.render(write_still=True)
        if not path.is_file():
            raise SplatwrightError(f"the render of {view.name} was not written to {path}")
        self.writer.add(view.split, view.name, cam)
        if self.backend is not None and view.split == "train":
            self.backend.call("add_view", lambda c: c.add_view(cam, path.read_bytes(), view.name),
                              self._views_added)
        self.done += 1

    def finish(self) -> None:
        """Restore the scene and write the transforms of what was rendered; safe to call more than once. A
        capture with training views becomes the one Send Views sends."""
        for owner, attr, value in reversed(self._saved):
            setattr(owner, attr, value)
        self._saved = []
        self.scene.frame_set(self.scene.frame_current)  # re-evaluate the animation at the restored frame
        if self._orbit_camera is not None:
            data = self._orbit_camera.data
            bpy.data.objects.remove(self._orbit_camera)
            bpy.data.cameras.remove(data)
            self._orbit_camera = None
        self.writer.write()
        if self.writer.frames["train"]:
            self.settings.capture_folder = str(self.folder)

    def summary(self) -> str:
        counts = {split: len(frames) for split, frames in self.writer.frames.items()}
        sent = f", training views sent to session {self.session}" if self.backend else \
            " (the backend is not connected, so nothing was sent)"
        return f"captured {counts['train']} training and {counts['test']} test views into {self.folder}{sent}"

    # ---- results on the main thread ----

    def _status(self, status: dict) -> None:
        self.backend.status = status

    def _views_added(self, reply: dict) -> None:
        self.backend.status["views"] = reply["views"]

    # ---- planning ----

    def _plan(self, context) -> list[View]:
        s, scene = self.settings, self.scene
        if s.source == "CAMERAS":
            cameras = [o for o in scene.objects if o.type == "CAMERA" and (o.select_get() or not s.only_selected)]
            if not cameras:
                raise SplatwrightError("no " + ("selected " if s.only_selected else "") + "camera objects")
            targets = [(None, None, cam) for cam in sorted(cameras, key=lambda o: o.name)]
        elif s.source == "ANIMATION":
            if scene.camera is None:
                raise SplatwrightError("the scene has no active camera")
            frames = range(scene.frame_start, scene.frame_end + 1, s.frame_step)
            targets = [(frame, None, scene.camera) for frame in frames]
        else:
            targets = [(None, m, self._make_orbit_camera()) for m in self._orbit_matrices(context)]
        return [View(f"r_{i:03d}", split_of(i, s.test_every), cam, frame, matrix)
                for i, (frame, matrix, cam) in enumerate(targets)]

    def _make_orbit_camera(self):
        if self._orbit_camera is None:
            data = bpy.data.cameras.new(ORBIT_CAMERA)
            data.lens, data.sensor_fit = self.settings.orbit_lens, "AUTO"
            self._orbit_camera = bpy.data.objects.new(ORBIT_CAMERA, data)
            self.scene.collection.objects.link(self._orbit_camera)
        return self._orbit_camera

    def _orbit_matrices(self, context) -> list[np.ndarray]:
        s = self.settings
        objects = [o for o in context.selected_objects if o.type in GEOMETRY] \
            if s.orbit_target == "SELECTION" else []
        center, radius = bounds(objects or visible_geometry(self.scene, context.view_layer))
        distance = s.orbit_radius
        if distance <= 0:
            cam = camera_of(self._make_orbit_camera(), self.scene)
            distance = fitting_distance(radius, cam.K, cam.width, cam.height)
        self._orbit_camera.data.clip_end = max(self._orbit_camera.data.clip_end, 4.0 * (distance + radius))
        return orbit_poses(center, distance, s.orbit_count, s.orbit_seed, s.orbit_shape == "HEMISPHERE")

    def _override_render_settings(self) -> None:
        """Blender renders the dataset the way training expects it: 8-bit RGBA PNGs, Standard view transform."""
        r, view = self.scene.render, self.scene.view_settings
        wanted = [(r, "resolution_percentage", self.settings.resolution_percentage), (r, "use_border", False),
                  (r, "film_transparent", self.settings.transparent), (r, "use_compositing", False),
                  (r, "use_sequencer", False), (r, "use_file_extension", True),
                  (r.image_settings, "file_format", "PNG"), (r.image_settings, "color_mode", "RGBA"),
                  (r.image_settings, "color_depth", "8"),
                  (self.scene.display_settings, "display_device", "sRGB"), (view, "view_transform", "Standard"),
                  (view, "look", "None"), (view, "exposure", 0.0), (view, "gamma", 1.0),
                  (view, "use_curve_mapping", False), (r, "filepath", r.filepath)]
        if hasattr(r.image_settings, "color_management"):  # new in Blender 4.x
            wanted.append((r.image_settings, "color_management", "FOLLOW_SCENE"))
        for owner, attr, value in wanted:
            self._saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, value)


def _blend_name() -> str:
    stem = Path(bpy.data.filepath).stem if bpy.data.filepath else "untitled"
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in stem).lstrip("_.-")
    return (safe or "untitled")[:40]


def _new_session(root: Path) -> tuple[str, Path]:
    """A session name (also its dataset folder's) not used before under `root`."""
    base = f"{_blend_name()}-{time.strftime('%Y%m%d-%H%M%S')}"
    name, n = base, 1
    while (root / name).exists():
        n += 1
        name = f"{base}-{n}"
    return name, root / name


def _dataset_root(folder: str) -> Path:
    """The dataset folder; a blend-relative one falls back to the temp folder while the file is unsaved."""
    if folder.startswith("//") and not bpy.data.filepath:
        return Path(tempfile.gettempdir()) / "splatwright"
    return Path(bpy.path.abspath(folder))

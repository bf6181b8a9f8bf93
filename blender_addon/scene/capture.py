"""One capture run: plan the views, render them one by one with Cycles or the scene's engine, write the dataset
and send each training view to the backend as soon as it is rendered.

In a Blender window each view renders as Blender's render job (advance() starts one and stores it once it has
ended), so the window stays live and Cancel stops a render midway; without a window (blender -b, the bpy
module) step() renders one view and returns when it is done."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import bpy
import numpy as np
from mathutils import Matrix

from ..core.errors import SplatwrightError
from ..core.points import POINTS_FILE, write_points
from ..logic.dataset import DatasetWriter, capture_percentage, fitting_distance, frame_time, orbit_poses, split_of
from ..logic.runtime import Backend
from .folders import dataset_root
from .reading import (GEOMETRY, animation_frames, bounds, camera_of, capture_cameras, surface_points,
                      visible_geometry)

ORBIT_CAMERA = "Splatwright Orbit"
SPLATS_ENGINE = "SPLATWRIGHT"  # the add-on's render engine shows the model: the views are rendered with Cycles
SAMPLED_ENGINES = {"CYCLES": ("cycles", "samples"), "BLENDER_EEVEE": ("eevee", "taa_render_samples"),
                   "BLENDER_EEVEE_NEXT": ("eevee", "taa_render_samples")}  # where each engine keeps its samples


@dataclass
class View:
    name: str
    split: str
    camera: object  # the camera object to render through
    frame: int | None = None  # set this frame first
    matrix: np.ndarray | None = None  # or place the camera here first (Blender camera-to-world)
    time: float | None = None  # the frame's time (dataset.frame_time) in a capture over time


class Capture:
    def __init__(self, context, backend: Backend | None):
        """`backend`: where to send the views, or None to only write the dataset. Everything that can refuse
        the capture is checked before its dataset folder or backend session is made."""
        self.scene = scene = context.scene
        self.settings = s = scene.splatwright
        self.backend = backend
        self._saved = [(scene, "camera", scene.camera), (scene, "frame_current", scene.frame_current)]
        self._orbit_camera = None
        self._points: tuple[np.ndarray, np.ndarray] | None = None  # the initial points, where the capture makes them
        self.session_opened = False  # the backend's session opens with the first training view
        self._render: RenderJob | None = None
        self._keep_render_window = render_window(context) is not None  # the user's own, open before
        self.stop_reason = ""  # why the capture was cancelled, once it was
        self.without_denoising = False  # Cycles was asked to denoise, and this one cannot
        self.session, self.folder = _new_session(dataset_root(s.folder))
        self.writer = DatasetWriter(self.folder)
        self.done = 0
        self.started = time.monotonic()
        try:
            self._override_render_settings()
            self.views = self._plan(context)
            if not self.views:
                raise SplatwrightError("no views to capture with these settings")
            for camera in {view.camera for view in self.views}:
                _check_camera(camera, scene)
            if s.initial_points:  # kept with the dataset, for Send to Backend and the command line's train
                self._points = surface_points(context, s.point_count, s.orbit_seed)
                self.folder.mkdir(parents=True, exist_ok=True)
                write_points(self.folder / POINTS_FILE, *self._points)
        except BaseException:
            self.finish()
            raise

    @property
    def total(self) -> int:
        return len(self.views)

    @property
    def finished(self) -> bool:
        return self.done >= len(self.views)

    @property
    def cancelled(self) -> bool:
        return bool(self.stop_reason)

    @property
    def current(self) -> View | None:
        """The view rendering now (or next)."""
        return None if self.finished else self.views[self.done]

    def seconds_left(self) -> float | None:
        """From the time the views so far took; None before the first is done."""
        if not self.done:
            return None
        return (time.monotonic() - self.started) / self.done * (self.total - self.done)

    def step(self) -> None:
        """Render, store and send the next view, blocking until it is rendered (no window: no render job)."""
        path = self._prepare()
        bpy.ops.render.render(write_still=True)
        self._store(path)

    def advance(self, context) -> None:
        """Render jobs, from the operator's timer in a window: store the view whose render job has ended, then
        start the next one. Never waits for a render. A render that ended unfinished cancels the capture."""
        if self._render is not None:
            if self._render.running:
                return
            render, self._render = self._render, None
            if render.window_closed():
                return self.cancel(f"capture cancelled: the render window was closed during {self.current.name}")
            if not render.path.is_file():
                return self.cancel(f"capture cancelled: the render of {self.current.name} stopped before it "
                                   "finished (Esc, or the render's error in the status bar)")
            self._store(render.path)
        if not self.finished:
            self._render = RenderJob(context, self._prepare())

    def cancel(self, reason: str = "capture cancelled") -> None:
        """Stop now, a render midway included (its view is dropped); finish() keeps the views stored so far."""
        self.stop_reason = self.stop_reason or reason
        if self._render is not None:
            self._render.stop()
            self._render.path.unlink(missing_ok=True)  # a stopped render job may still have written its image
            self._render = None

    def finish(self) -> None:
        """Restore the scene and write the transforms of what was rendered; safe to call more than once. A
        capture with training views becomes the one Send to Backend sends."""
        if self._render is not None:
            self.cancel()
        if not self._keep_render_window:
            close_render_window()
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
        if not any(self.writer.frames.values()):
            self._remove_empty_folder()

    def _remove_empty_folder(self) -> None:
        """A capture that stored no view leaves no dataset folder: only what it made there goes (its initial
        points, the empty split folders), so a folder anything else was put into stays."""
        (self.folder / POINTS_FILE).unlink(missing_ok=True)
        for place in [self.folder / split for split in self.writer.frames] + [self.folder]:
            try:
                place.rmdir()
            except OSError:  # not there, or not empty
                pass

    def summary(self) -> str:
        counts = {split: len(frames) for split, frames in self.writer.frames.items()}
        if not any(counts.values()):
            text = "captured no view"
        else:
            if not self.backend:
                sent = " (the backend is not connected, so nothing was sent)"
            elif counts["train"]:
                sent = f", training views sent to session {self.session}"
            else:
                sent = ", so none was sent"
            text = f"captured {counts['train']} training and {counts['test']} test views into {self.folder}{sent}"
        if self.without_denoising:  # more samples make up for it
            text += "; rendered without denoising, which this Blender's Cycles cannot do"
        return text

    # ---- one view ----

    def _prepare(self) -> Path:
        """Put the scene's camera where the next view is seen from; the path its render is written to."""
        view = self.current
        scene = self.scene
        if view.frame is not None:
            scene.frame_set(view.frame)
        if view.matrix is not None:
            view.camera.matrix_world = Matrix(view.matrix.tolist())
            bpy.context.view_layer.update()
        scene.camera = view.camera
        path = self.writer.image_path(view.split, view.name)
        scene.render.filepath = str(path)
        return path

    def _store(self, path: Path) -> None:
        view = self.current
        if not path.is_file():
            raise SplatwrightError(f"the render of {view.name} was not written to {path}")
        cam = camera_of(view.camera, self.scene)
        self.writer.add(view.split, view.name, cam, view.time)
        if self.backend is not None and view.split == "train":
            self._open_session()
            self.backend.call("add_view", lambda c: c.add_view(cam, path.read_bytes(), view.name, view.time),
                              self._views_added)
        self.done += 1

    def _open_session(self) -> None:
        """Open the capture's session in the backend, with its initial points, before its first training view:
        a capture that sends no view leaves no empty session behind."""
        if self.session_opened:
            return
        self.session_opened = True
        name = self.settings.session = self.session
        self.backend.call("open_session", lambda c: c.call("open_session", name=name), self._status)
        if self._points is not None:
            xyz, rgb = self._points
            self.backend.call("set_points", lambda c: c.set_points(xyz, rgb))

    # ---- results on the main thread ----

    def _status(self, status: dict) -> None:
        self.backend.status = status

    def _views_added(self, reply: dict) -> None:
        self.backend.status["views"] = reply["views"]

    # ---- planning ----

    def _plan(self, context) -> list[View]:
        """The views in render order. Over time (Animation, Animation from the Rig) of a Moving Scene each
        carries its frame's time; a rig's held-out cameras are held out at every frame."""
        s, scene = self.settings, self.scene

        def time_of(frame: int) -> float | None:
            return frame_time(frame, scene.frame_start, scene.frame_end) if s.moving_scene else None
        if s.source == "ANIMATION":
            if scene.camera is None:
                raise SplatwrightError("the scene has no active camera to animate; set one or choose Views: Orbit")
            return [View(f"r_{i:03d}", split_of(i, s.test_every), scene.camera, frame, time=time_of(frame))
                    for i, frame in enumerate(animation_frames(scene))]
        rig = self._rig(context)  # (camera object, matrix or None) of each camera
        if s.source != "RIG_ANIMATION":
            return [View(f"r_{i:03d}", split_of(i, s.test_every), cam, matrix=matrix)
                    for i, (cam, matrix) in enumerate(rig)]
        return [View(f"r_{f:03d}_{c:03d}", split_of(c, s.test_every), cam, frame, matrix, time_of(frame))
                for f, frame in enumerate(animation_frames(scene)) for c, (cam, matrix) in enumerate(rig)]

    def _rig(self, context) -> list[tuple[object, np.ndarray | None]]:
        """Scene Cameras: the camera objects; Orbit, and Animation from the Rig without camera objects: the
        generated cameras around the selection or the scene (placed at the current frame; they stay put)."""
        s = self.settings
        cameras = capture_cameras(self.scene)
        if s.source == "CAMERAS" and not cameras:
            raise SplatwrightError("no " + ("selected " if s.only_selected else "") + "camera objects to "
                                   "capture from; add a camera or choose Views: Orbit")
        if s.source == "ORBIT" or not cameras:
            orbit_camera = self._make_orbit_camera()
            return [(orbit_camera, m) for m in self._orbit_matrices(context)]
        return [(cam, None) for cam in cameras]

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
        """Blender renders the dataset the way training expects it: 8-bit RGBA PNGs, Standard view transform,
        with Cycles in place of the add-on's own engine and the capture's samples, not denoising where this
        Cycles has no denoiser."""
        s, scene = self.settings, self.scene
        r, view = scene.render, scene.view_settings
        percentage = capture_percentage(r.resolution_x, r.resolution_y, s.resolution_percentage, s.max_side)
        wanted = [(r, "resolution_percentage", percentage), (r, "use_border", False),
                  (r, "film_transparent", s.transparent), (r, "use_compositing", False),
                  (r, "use_sequencer", False), (r, "use_file_extension", True),
                  (r.image_settings, "file_format", "PNG"), (r.image_settings, "color_mode", "RGBA"),
                  (r.image_settings, "color_depth", "8"),
                  (scene.display_settings, "display_device", "sRGB"), (view, "view_transform", "Standard"),
                  (view, "look", "None"), (view, "exposure", 0.0), (view, "gamma", 1.0),
                  (view, "use_curve_mapping", False), (r, "filepath", r.filepath)]
        if hasattr(r.image_settings, "color_management"):  # new in Blender 4.x
            wanted.append((r.image_settings, "color_management", "FOLLOW_SCENE"))
        engine = "CYCLES" if s.render_engine == "CYCLES" or r.engine == SPLATS_ENGINE else r.engine
        wanted.append((r, "engine", engine))
        if s.samples and engine in SAMPLED_ENGINES:
            group, name = SAMPLED_ENGINES[engine]
            wanted.append((getattr(scene, group), name, s.samples))
        if engine == "CYCLES" and scene.cycles.use_denoising and not cycles_has_denoiser(scene):
            wanted.append((scene.cycles, "use_denoising", False))
            self.without_denoising = True
        for owner, attr, value in wanted:
            self._saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, value)


def cycles_has_denoiser(scene) -> bool:
    """Whether this Blender's Cycles can denoise the scene: Debian's Blender 3.4 is built without
    OpenImageDenoise, and a render asking to denoise stops at once; OptiX without its device falls back to
    OpenImageDenoise."""
    import _cycles  # Cycles' own module, there whenever Cycles renders
    return scene.cycles.denoiser == "OPTIX" or bool(_cycles.with_openimagedenoise)


class RenderJob:
    """One view rendering as Blender's render job, shown in Blender's render window. Blender ends it when the
    render is done (write_still has written the image then), on Esc or the job's stop button in the status
    bar (no image), or when its window closes: the render operator keeps its handler in that window, and
    closing the window is how stop() ends the job midway."""

    def __init__(self, context, path: Path):
        self.path = path
        view = context.preferences.view
        display, view.render_display_type = view.render_display_type, "WINDOW"
        try:
            started = bpy.ops.render.render("INVOKE_DEFAULT", write_still=True)
        finally:
            view.render_display_type = display
        if "RUNNING_MODAL" not in started:
            raise SplatwrightError(f"Blender did not start the render of {path.stem} (another render running?)")
        self._window = render_window(context)

    @property
    def running(self) -> bool:
        return bpy.app.is_job_running("RENDER")

    def window_closed(self) -> bool:
        return self._window is not None and render_window(bpy.context) != self._window

    def stop(self) -> None:
        """End the render now (Blender waits for the renderer to notice, a fraction of a second)."""
        if self.running:
            close_render_window()


def render_window(context):
    """Blender's render window (a temporary one holding only the Render Result), or None."""
    for window in context.window_manager.windows:
        screen = window.screen
        if screen.is_temporary and len(screen.areas) == 1 and screen.areas[0].type == "IMAGE_EDITOR":
            return window
    return None


def close_render_window() -> None:
    window = render_window(bpy.context)
    if window is not None:
        with bpy.context.temp_override(window=window):
            bpy.ops.wm.window_close()


def _check_camera(camera, scene) -> None:
    """Refuse cameras that cannot be trained on (orthographic, panoramic, an empty render size)."""
    try:
        camera_of(camera, scene)
    except SplatwrightError as e:
        raise SplatwrightError(f"camera {camera.name}: {e}") from None


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

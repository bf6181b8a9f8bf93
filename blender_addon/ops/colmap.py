"""Import COLMAP: a model's cameras, photos and points into the scene (Send to Backend and Capture & Train send
its training photos to the backend, with From set to Photos); and Make Cameras from Photos: a folder of photos or
a video made into such a model by the backend's structure from motion, then brought in the same way. A timer moves
it on as the backend allows, so Blender never waits."""
from __future__ import annotations

from pathlib import Path

import bpy
from bpy.props import BoolProperty, EnumProperty, FloatProperty, StringProperty
from bpy.types import Operator

from ..core import colmap
from ..core.errors import SplatwrightError
from ..core.reconstruction import unpack_capture
from ..logic.reconstruction import Reconstruction, source_of, upload
from ..logic.undistortion import Undistortion
from ..scene import live
from ..scene.addon import prefs, sources
from ..scene.colmap import import_model
from ..scene.folders import dataset_root
from ..scene.session import training_runs
from .base import PHOTOS, Guarded, connect

TICK = 0.2  # seconds between Make Cameras from Photos' checks
UP_AXIS, CENTRE, SCALE = "CAMERAS", True, 1.0  # Import COLMAP's defaults, which Make Cameras from Photos uses
RECONSTRUCT, FETCH = "reconstruct", "fetch_reconstruction"  # Make Cameras from Photos' jobs on the backend's worker

UP_AXIS_ITEMS = [
    ("CAMERAS", "Guess From Cameras", "The cameras' mean up direction (their images' -Y) becomes Blender's +Z"),
    ("MINUS_Y", "COLMAP -Y", "COLMAP's -Y becomes +Z and its +Z (the way an unturned camera looks) +Y"),
    ("KEEP", "Keep COLMAP's Axes", "COLMAP's world as it is: its Z is Blender's Z"),
]
assert [item[0] for item in UP_AXIS_ITEMS] == list(colmap.UP_AXES)


class SPLATWRIGHT_OT_import_colmap(Guarded, Operator):
    """Import a COLMAP model (cameras, images and points3D, .bin or .txt, with its images folder) as cameras with
    their photos as background images and a point cloud, under one Empty that places them in the scene; a model
    with lens distortion is undistorted first, into undistorted/ beside its images"""
    bl_idname = "splatwright.import_colmap"
    bl_label = "Import COLMAP"
    bl_options = {"REGISTER", "UNDO"}

    directory: StringProperty(name="Folder", subtype="DIR_PATH",
                              description="The capture folder (images/ beside sparse/0/ or sparse/) or its model folder")
    filter_folder: BoolProperty(default=True, options={"HIDDEN"})
    up_axis: EnumProperty(name="Up Axis", items=UP_AXIS_ITEMS, default=UP_AXIS)
    centre: BoolProperty(name="Centre", default=CENTRE,
                         description="Put the points' median (the cameras' centre without points) at the origin")
    scale: FloatProperty(name="Scale", default=SCALE, min=1e-6, soft_max=100.0,
                         description="Blender units per COLMAP unit (COLMAP's scale is arbitrary)")

    def invoke(self, context, event):
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        """A model with lens distortion is undistorted first (logic/undistortion.py): waiting here without a
        window, else while the operator runs modal, Esc cancelling."""
        try:
            root, folder = colmap.capture_folders(self.directory)
            distorted = colmap.distortion(root, colmap.read_model(folder))
            made = colmap.undistorted_copy(root) if distorted else None
            if not distorted or made is not None:
                return self.finish(context, made or self.directory, made and self.note(distorted, made))
            job = Undistortion(root, blenders_pycolmap(), prefs(context).backend_python(), sources())
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        self.distorted, self.job = distorted, job
        started = f"Undistorting the {', '.join(distorted)} camera's photos of {root} {job.how}..."
        if bpy.app.background or context.window is None:
            print(started, flush=True)
            return self.undistorted(context)
        self.report({"INFO"}, started)
        context.workspace.status_text_set(started + " (Esc cancels)")
        self._timer = context.window_manager.event_timer_add(0.2, window=context.window)
        context.window_manager.modal_handler_add(self)
        return {"RUNNING_MODAL"}

    def modal(self, context, event):
        if event.type == "ESC":
            self.job.cancel()
            self.stop_modal(context)
            self.report({"WARNING"}, "Import COLMAP cancelled while undistorting")
            return {"CANCELLED"}
        if event.type != "TIMER" or not self.job.finished:
            return {"PASS_THROUGH"}
        self.stop_modal(context)
        return self.undistorted(context)

    def stop_modal(self, context) -> None:
        context.window_manager.event_timer_remove(self._timer)
        context.workspace.status_text_set(None)

    def undistorted(self, context):
        try:
            made = self.job.wait()
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        return self.finish(context, made, self.note(self.distorted, made, self.job.how))

    @staticmethod
    def note(distorted: list[str], made, how: str = "") -> str:
        return (f"the {', '.join(distorted)} camera's photos {'were undistorted ' + how if how else 'are undistorted'}"
                f" to pinhole cameras in {made}, which is what came in")

    def finish(self, context, directory, note: str | None):
        try:
            _, summary = import_model(context, str(directory), self.up_axis, self.centre, self.scale)
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        self.report({"INFO"}, f"{summary}; {note}" if note else summary)
        return {"FINISHED"}


def blenders_pycolmap():
    """pycolmap where Blender's Python has it (imported only for a distorted model: it is large), else None."""
    try:
        import pycolmap
    except ImportError:
        return None
    return pycolmap


class SPLATWRIGHT_OT_reconstruct(Guarded, Operator):
    """Make cameras and points from the chosen folder of photos or video with the backend's structure from motion
    (starting the backend where none runs), bring them in as Import COLMAP does, and set From to Photos"""
    bl_idname = "splatwright.reconstruct"
    bl_label = "Make Cameras from Photos"

    @classmethod
    def blocked(cls, context):
        if live.photos is not None:
            return "Wait for the photos' cameras (or cancel them)"
        if reason := training_runs():
            return reason
        return "" if context.scene.splatwright.photos_path else "Choose a folder of photos or a video"

    def execute(self, context):
        s = context.scene.splatwright
        try:
            source = source_of(bpy.path.abspath(s.photos_path))
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        if live.backend.connection not in ("connected", "connecting"):
            connect(context)
        live.photos = Reconstruction(source, s.video_rate)
        live.backend.reconstruction = {}
        live.redraw()
        return {"FINISHED"}


class SPLATWRIGHT_OT_reconstruct_cancel(Guarded, Operator):
    """Stop making cameras from the photos: the upload, or the backend's structure from motion at its next step"""
    bl_idname = "splatwright.reconstruct_cancel"
    bl_label = "Cancel"

    @classmethod
    def blocked(cls, context):
        return "" if live.photos is not None else "No photos are being made into cameras"

    def execute(self, context):
        job = live.photos
        job.cancelled = True
        if job.stage == "start":
            live.photos = None
        elif job.stage in ("starting", "running"):  # after the reconstruct request, on the worker
            live.backend.call("cancel_reconstruction", lambda client: client.call("cancel_reconstruction"))
        return {"FINISHED"}


def reconstruction_progress() -> tuple[float | None, str]:
    """(the share done, or None, and what it says) of Make Cameras from Photos; (None, '') where it does not run."""
    b, job = live.backend, live.photos
    if job is None:
        return None, ""
    return job.progress(b.connection == "connecting", b.remote, b.reconstruction)


def advance_photos() -> float:
    """The timer: start the reconstruction once the backend is connected, then bring in what it made."""
    job, b = live.photos, live.backend
    if job is None or b.connection == "connecting" or (job.stage == "start" and b.in_flight):
        return TICK
    if b.connection != "connected":  # it failed to start or was lost: its report says why
        live.photos = None
    elif job.stage == "start":
        job.stage = "starting"
        b.call(RECONSTRUCT, lambda client: start_reconstruction(client, job, local=not b.remote),
               lambda reply: started(job, reply))
    elif job.stage in ("starting", "fetching") and not b.in_flight[RECONSTRUCT] and not b.in_flight[FETCH]:
        live.photos = None  # the request failed, as its report says
    elif job.stage == "running" and b.reconstruction.get("capture") == job.source.capture:
        event = b.reconstruction
        if event["state"] in ("failed", "cancelled"):  # reported as the event came
            live.photos = None
        elif event["state"] == "finished" and job.cancelled:  # it finished before the cancel reached it
            live.photos = None
        elif event["state"] == "finished":
            job.stage = "fetching"
            if b.remote:
                root = dataset_root(bpy.context.scene.splatwright.folder) / job.source.capture
                b.call(FETCH, lambda client: fetch(client, job.source.capture, root),
                       lambda folder: bring_in(job, folder, event["message"]))
            else:  # the capture is on this machine, where the backend made it
                b.call(FETCH, lambda client: event["folder"], lambda folder: bring_in(job, folder, event["message"]))
    return TICK


def start_reconstruction(client, job: Reconstruction, local: bool):
    """On the worker: a backend on this machine reads the photos where they are; one elsewhere gets them uploaded
    first. The reply of reconstruct, or None where the upload was cancelled."""
    capture, rate = job.source.capture, job.rate
    if local:
        return client.call(RECONSTRUCT, capture=capture, path=str(job.source.path), rate=rate)

    def sent(done: int, total: int) -> None:
        job.uploaded = (done, total)
    if not upload(client, job.source, lambda: job.cancelled, sent):
        return None
    return client.call(RECONSTRUCT, capture=capture, rate=rate)


def started(job: Reconstruction, reply) -> str:
    if reply is None:
        live.photos = None
        return f"the upload of {job.source.path} was cancelled"
    job.stage = "running"
    return f"the backend makes cameras from {reply['source']} as {reply['capture']}"


def fetch(client, capture: str, root: Path) -> Path:
    """On the worker: the capture from a backend on another machine, unpacked into `root`."""
    reply = client.request(FETCH, {"capture": capture})
    root.mkdir(parents=True, exist_ok=True)
    return unpack_capture(reply.payload, root)


def bring_in(job: Reconstruction, folder, made: str) -> str:
    """On the main thread: the capture made comes in as Import COLMAP brings a model in, and From is Photos."""
    live.photos = None
    if job.cancelled:
        return f"{job.source.path.name}: cancelled; the cameras made were not brought in"
    context = bpy.context
    _, summary = import_model(context, str(folder), UP_AXIS, CENTRE, SCALE)
    context.scene.splatwright.source = PHOTOS
    return f"{job.source.path.name}: {made}; {summary}"


def import_menu(self, context):
    self.layout.operator(SPLATWRIGHT_OT_import_colmap.bl_idname, text="COLMAP Model (cameras, photos, points)")


CLASSES = (SPLATWRIGHT_OT_import_colmap, SPLATWRIGHT_OT_reconstruct, SPLATWRIGHT_OT_reconstruct_cancel)
_register_classes, _unregister_classes = bpy.utils.register_classes_factory(CLASSES)


def register():
    _register_classes()
    bpy.types.TOPBAR_MT_file_import.append(import_menu)
    bpy.app.timers.register(advance_photos, first_interval=TICK, persistent=True)


def unregister():
    if bpy.app.timers.is_registered(advance_photos):
        bpy.app.timers.unregister(advance_photos)
    bpy.types.TOPBAR_MT_file_import.remove(import_menu)
    _unregister_classes()

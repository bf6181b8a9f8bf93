"""Import COLMAP: a model's cameras, photos and points into the scene (Send to Backend and Capture & Train send
its training photos to the backend, with From set to Photos)."""
from __future__ import annotations

import bpy
from bpy.props import BoolProperty, EnumProperty, FloatProperty, StringProperty
from bpy.types import Operator

from ..core import colmap
from ..core.errors import SplatwrightError
from ..logic.undistortion import Undistortion
from ..scene.addon import prefs, sources
from ..scene.colmap import import_model
from .base import Guarded

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
    up_axis: EnumProperty(name="Up Axis", items=UP_AXIS_ITEMS, default="CAMERAS")
    centre: BoolProperty(name="Centre", default=True,
                         description="Put the points' median (the cameras' centre without points) at the origin")
    scale: FloatProperty(name="Scale", default=1.0, min=1e-6, soft_max=100.0,
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
            empty, summary = import_model(context, str(directory), self.up_axis, self.centre, self.scale)
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        for obj in context.view_layer.objects.selected:
            obj.select_set(False)
        empty.select_set(True)
        context.view_layer.objects.active = empty
        self.report({"INFO"}, f"{summary}; {note}" if note else summary)
        return {"FINISHED"}


def blenders_pycolmap():
    """pycolmap where Blender's Python has it (imported only for a distorted model: it is large), else None."""
    try:
        import pycolmap
    except ImportError:
        return None
    return pycolmap


def import_menu(self, context):
    self.layout.operator(SPLATWRIGHT_OT_import_colmap.bl_idname, text="COLMAP Model (cameras, photos, points)")


CLASSES = (SPLATWRIGHT_OT_import_colmap,)
_register_classes, _unregister_classes = bpy.utils.register_classes_factory(CLASSES)


def register():
    _register_classes()
    bpy.types.TOPBAR_MT_file_import.append(import_menu)


def unregister():
    bpy.types.TOPBAR_MT_file_import.remove(import_menu)
    _unregister_classes()

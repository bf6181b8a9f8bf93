"""Splat objects: Add Model to Scene, Show Model (open an object's session and load its model), Add Crop Box, and
on Blender 5.3 and later Keep Outside .blend and Store in .blend (a native object's model in a file of its own, or
in the .blend: scene/linked.py)."""
from __future__ import annotations

import os

import bpy
from bpy.props import StringProperty
from bpy.types import Operator

from ..core.errors import SplatwrightError
from ..logic.messages import at_step
from ..logic.native import outside_file
from ..scene import linked, live, native
from ..scene.session import SHOW_MODEL, capture_runs, nothing_to_show, not_connected, set_status, training_runs
from ..scene.splats import SESSION_KEY, active_model, add_crop_box, crop_box
from .base import Guarded, add_model_to_scene


def open_model(client, session: str) -> dict:
    """On the worker: open `session` and load its checkpoint; the backend's status."""
    client.call("open_session", name=session, create=False)
    client.call("load_checkpoint")
    return client.call("status")


class SPLATWRIGHT_OT_add_model(Guarded, Operator):
    """Put the backend's model of the open session in the scene: as Blender's own splats where Blender draws
    them (5.3 and later), else as an Empty around it whose splats final renders composite with the scene's
    meshes by depth. Its transform moves the splats"""
    bl_idname = "splatwright.add_model"
    bl_label = "Add Model to Scene"

    @classmethod
    def blocked(cls, context):
        return not_connected() or ("" if live.backend.status.get("session")
                                   else "Open a session first (capture, or start the backend)")

    def execute(self, context):
        if reason := nothing_to_show():
            self.report({"ERROR"}, reason)
            return {"CANCELLED"}
        add_model_to_scene(context, live.backend.status["session"])
        return {"FINISHED"}


class SPLATWRIGHT_OT_add_crop_box(Guarded, Operator):
    """Crop the active splat object's model to a box: only the splats whose centres lie inside it are drawn,
    rendered and exported (on Blender's own splats, by a Geometry Nodes modifier). Move, turn and scale the box
    (its axes may differ) to choose what is kept"""
    bl_idname = "splatwright.add_crop_box"
    bl_label = "Add Crop Box"

    @classmethod
    def blocked(cls, context):
        obj = active_model(context)
        if obj is None:
            return "Select a splat object"  # as Show Model says: the panel shows it once
        if obj.type == "POINTCLOUD" and not native.linked_path(obj) and len(obj.data.points) == 0:
            return f"{obj.name} has no splats to crop"
        box = crop_box(obj)
        return f"{obj.name} has a crop box, {box.name}: move or scale it" if box is not None else ""

    def execute(self, context):
        obj = active_model(context)
        box = add_crop_box(context.view_layer, obj)
        self.report({"INFO"}, f"added {box.name}: {obj.name} shows the splats inside it")
        return {"FINISHED"}


class SPLATWRIGHT_OT_show_model(Guarded, Operator):
    """Open the session of the active splat object in the backend and load its model (its last checkpoint)"""
    bl_idname = "splatwright.show_model"
    bl_label = "Show Model"

    @classmethod
    def blocked(cls, context):
        obj = context.active_object
        if obj is None or SESSION_KEY not in obj:
            return not_connected() or "Select a splat object"
        if not obj[SESSION_KEY]:
            return f"{obj.name} shows a linked file, not a session's model"
        return not_connected() or training_runs() or capture_runs() or \
            ("Its session is open" if live.backend.status.get("session") == obj[SESSION_KEY] else "")

    def execute(self, context):
        session = context.active_object[SESSION_KEY]

        def shown(status) -> str:
            set_status(status)
            return f"opened session {session} and its model{at_step(status['step'])}"
        live.backend.call(SHOW_MODEL, lambda client: open_model(client, session), shown)
        return {"FINISHED"}


class SPLATWRIGHT_OT_keep_outside(Guarded, Operator):
    """Keep the active splat object's model in a 3DGS PLY file outside the .blend, which then keeps only the
    file's path (relative to the .blend's folder): the object shows the file through a Geometry Nodes modifier and
    no longer follows training. Store in .blend takes it back"""
    bl_idname = "splatwright.keep_outside"
    bl_label = "Keep Outside .blend"

    filepath: StringProperty(name="File", subtype="FILE_PATH", default="",
                             description="The PLY file to write (empty: //<object name>.ply, beside the .blend)")
    filter_glob: StringProperty(default="*.ply", options={"HIDDEN"})

    @classmethod
    def blocked(cls, context):
        obj = active_model(context)
        if not native.available():
            return "Blender 5.3 or later keeps a model outside the .blend"
        if obj is None or obj.type != "POINTCLOUD":
            return "Select a native splat object"
        if path := native.linked_path(obj):
            return f"{obj.name} is kept in {path}"
        if linked.writing(obj):
            return f"{obj.name}'s file is being written"
        if native.moving(obj.data):
            return f"{obj.name} holds a 4D model, which stays in the .blend"
        return "" if len(obj.data.points) else f"{obj.name} has no splats to keep"

    def invoke(self, context, event):
        if not self.filepath:
            name = os.path.basename(outside_file("", active_model(context).name, True))
            self.filepath = bpy.path.abspath(f"//{name}") if bpy.data.filepath else name
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        obj = active_model(context)
        try:
            path = outside_file(self.filepath, obj.name, bool(bpy.data.filepath))
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        path = os.path.normpath(bpy.path.abspath(path))
        linked.keep_outside(obj, path)
        self.report({"INFO"}, f"writing {obj.name}'s {len(obj.data.points):,} splats to {path}")
        return {"FINISHED"}


class SPLATWRIGHT_OT_store_in_blend(Guarded, Operator):
    """Store the active splat object's model, kept in a file, in the .blend again: its point cloud holds the
    file's splats and the object no longer reads the file (one of a session follows training again)"""
    bl_idname = "splatwright.store_in_blend"
    bl_label = "Store in .blend"

    @classmethod
    def blocked(cls, context):
        obj = active_model(context)
        if obj is None or not native.linked_path(obj):
            return "Select a splat object kept outside the .blend"
        return "" if os.path.isfile(linked.file_of(obj)) else f"{native.linked_path(obj)} is missing: put it back first"

    def execute(self, context):
        obj = active_model(context)
        path = native.linked_path(obj)
        try:
            count = native.store_file(context, obj)
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        follows = f"; it follows session {obj[SESSION_KEY]}'s training again" if obj[SESSION_KEY] else ""
        self.report({"INFO"}, f"{obj.name} holds its {count:,} splats of {path} in the .blend{follows}")
        return {"FINISHED"}


CLASSES = (SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_show_model, SPLATWRIGHT_OT_add_crop_box,
           SPLATWRIGHT_OT_keep_outside, SPLATWRIGHT_OT_store_in_blend)

register, unregister = bpy.utils.register_classes_factory(CLASSES)

"""Splat objects: Add Model to Scene, Show Model (open an object's session and load its model), Add Crop Box."""
from __future__ import annotations

import bpy
from bpy.types import Operator

from ..logic.messages import at_step
from ..scene import live
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
        if obj.type == "POINTCLOUD" and len(obj.data.points) == 0:
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
        return not_connected() or training_runs() or capture_runs() or \
            ("Its session is open" if live.backend.status.get("session") == obj[SESSION_KEY] else "")

    def execute(self, context):
        session = context.active_object[SESSION_KEY]

        def shown(status) -> str:
            set_status(status)
            return f"opened session {session} and its model{at_step(status['step'])}"
        live.backend.call(SHOW_MODEL, lambda client: open_model(client, session), shown)
        return {"FINISHED"}


CLASSES = (SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_show_model, SPLATWRIGHT_OT_add_crop_box)

register, unregister = bpy.utils.register_classes_factory(CLASSES)

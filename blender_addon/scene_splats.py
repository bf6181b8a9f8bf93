"""Splat models as objects of the scene: Add Model to Scene puts the backend's model of the open session in the
scene as an Empty (a cube around the model) named after the session. Its transform places the splats in every
view and final render (placement.py), hiding it or leaving it out of renders hides them, deleting it removes
them. The link is two custom properties of the object, saved with the .blend: the session and the point of the
model at the object's origin."""
from __future__ import annotations

import tempfile
from pathlib import Path

import bpy
import numpy as np
from bpy.types import Operator

from . import composite, live
from .core.cameras import Camera
from .core.errors import SplatwrightError
from .operators import Guarded, nothing_to_show, not_connected, set_status, training_runs
from .panels import SplatsPanel, buttons, labels
from .placement import camera_in_model, model_bounds, model_to_world, uniform_scale

SESSION_KEY = "splatwright_session"  # the session whose model the object places
CENTRE_KEY = "splatwright_centre"  # the model-space point at the object's origin


def splat_objects(scene) -> list:
    """The scene's objects that place a splat model, by name."""
    return sorted((o for o in scene.objects if SESSION_KEY in o), key=lambda o: o.name)


def model_matrix(obj) -> np.ndarray:
    """Where `obj` places its model: model space to world."""
    return model_to_world(np.array(obj.matrix_world), obj[CENTRE_KEY])


def placed_camera(obj, camera: Camera, what: str = "") -> tuple[Camera, float]:
    """The camera to render `obj`'s model through for `camera`, and the factor from its depths to the scene's;
    a placement splats cannot take is refused naming `what` (the object)."""
    return camera_in_model(camera, model_matrix(obj), what or obj.name)


def not_shown(obj) -> str:
    """Why the backend does not show `obj`'s model now, or ''."""
    b, session = live.backend, obj[SESSION_KEY]
    if reason := not_connected():
        return reason
    shown = b.status.get("session")
    if shown != session:
        return f"The backend shows {f'session {shown}' if shown else 'no session'}; Show Model opens {session}"
    return nothing_to_show()


def problem(obj) -> str:
    """Why `obj`'s splats are not drawn, or ''."""
    try:
        uniform_scale(model_matrix(obj), obj.name)
    except SplatwrightError as e:
        return str(e)
    return not_shown(obj)


def show_session(client, session: str) -> None:
    """On the worker, for a final render: a backend showing nothing yet (a fresh one, as `blender -b` starts)
    opens `session` and loads its checkpoint; one showing another session's model is left as it is."""
    status = client.call("status")
    if status["gaussians"]:
        if status["session"] != session:
            raise SplatwrightError(f"the backend shows session {status['session']}, not {session}; select the "
                                   "splat object and press Show Model to open it")
        return
    open_model(client, session)


def open_model(client, session: str) -> dict:
    """On the worker: open `session` and load its checkpoint; the backend's status."""
    client.call("open_session", name=session, create=False)
    client.call("load_checkpoint")
    return client.call("status")


class SPLATWRIGHT_OT_add_model(Guarded, Operator):
    """Put the backend's model of the open session in the scene as an Empty around it: its transform moves the
    splats in the viewport and in final renders, which composite them with the scene's meshes by depth"""
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
        session, scene, view_layer = live.backend.status["session"], context.scene, context.view_layer
        collection = context.collection

        def bounds(client):  # on the worker: the model's box from its Gaussians
            reply = client.request("export_ply")
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "model.ply"
                path.write_bytes(reply.payload)
                return model_bounds(path)

        def add(result) -> str:
            centre, half_size = result
            obj = add_model_object(view_layer, collection, session, centre, half_size)
            composite.prepare(scene)
            return (f"added {obj.name}, the model of session {session}; final renders composite it through the "
                    "scene's compositor")
        live.backend.call("add_model", bounds, add)
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
        return not_connected() or training_runs() or \
            ("Its session is open" if live.backend.status.get("session") == obj[SESSION_KEY] else "")

    def execute(self, context):
        session = context.active_object[SESSION_KEY]

        def shown(status) -> str:
            set_status(status)
            return f"opened session {session} and its model at step {status['step']}"
        live.backend.call("show_model", lambda client: open_model(client, session), shown)
        return {"FINISHED"}


def add_model_object(view_layer, collection, session: str, centre, half_size: float):
    """The Empty that places session `session`'s model, at its centre, selected and active."""
    obj = bpy.data.objects.new(session, None)
    obj.empty_display_type = "CUBE"
    obj.empty_display_size = half_size
    obj.location = [float(c) for c in centre]  # so the model stays where it was trained
    obj[SESSION_KEY] = session
    obj[CENTRE_KEY] = [float(c) for c in centre]
    collection.objects.link(obj)
    for other in view_layer.objects.selected:
        other.select_set(False)
    try:
        obj.select_set(True, view_layer=view_layer)
        view_layer.objects.active = obj
    except RuntimeError:  # its collection is excluded from the view layer: it stays unselected
        pass
    return obj


class SPLATWRIGHT_PT_scene_splats(SplatsPanel, bpy.types.Panel):
    bl_label = "Splats in the Scene"

    def draw(self, context):
        layout = self.layout
        buttons(layout, context, SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_show_model,
                icons=("OUTLINER_OB_EMPTY", "HIDE_OFF"))
        for obj in splat_objects(context.scene):
            layout.label(text=f"{obj.name}: session {obj[SESSION_KEY]}", icon="OUTLINER_OB_EMPTY")
            if reason := problem(obj):
                labels(layout, context, reason, icon="INFO")


CLASSES = (SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_show_model, SPLATWRIGHT_PT_scene_splats)
register, unregister = bpy.utils.register_classes_factory(CLASSES)

"""Splat models as objects of the scene: Add Model to Scene puts the backend's model of the open session in the
scene as an Empty (a cube around the model) named after the session. Its transform places the splats in every
view and final render (placement.py), hiding it or leaving it out of renders hides them, deleting it removes
them. The link is two custom properties of the object, saved with the .blend: the session and the point of the
model at the object's origin. Each object shows its session's model (the open session's as it trains, another
session's as it was last saved), so a scene may hold several, of one session or more.

Add Crop Box parents a cube-shaped Empty to the model object (marked by a custom property): only the splats
whose centres lie inside it are drawn, rendered and exported. It may be moved, turned and scaled unevenly."""
from __future__ import annotations

import tempfile
from pathlib import Path

import bpy
import numpy as np
from bpy.types import Operator

from . import composite, live
from .core.cameras import Camera
from .core.errors import SplatwrightError
from .dataset import frame_time
from .messages import at_step
from .operators import (SHOW_MODEL, Guarded, capture_runs, nothing_to_show, not_connected, set_status,
                        training_runs)
from .panels import SplatsPanel, buttons, labels
from .placement import camera_in_model, crop_matrix, model_bounds, model_to_world, uniform_scale

SESSION_KEY = "splatwright_session"  # the session whose model the object places
CENTRE_KEY = "splatwright_centre"  # the model-space point at the object's origin
CROP_KEY = "splatwright_crop_box"  # on a cube-shaped Empty parented to a model object: the box it is cropped to


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


def crop_box(obj):
    """The crop box parented to model object `obj`, or None."""
    return next((child for child in sorted(obj.children, key=lambda o: o.name) if CROP_KEY in child), None)


def model_choice(obj, scene, cropped: bool = True) -> dict:
    """What a render or export request names for `obj`'s model (protocol.MODEL_CHOICE): its session, its crop
    box (unless not `cropped`) as a matrix from model space into the box's unit cube, and `scene`'s time."""
    box = crop_box(obj) if cropped else None
    crop = None if box is None else crop_matrix(np.array(box.matrix_world), box.empty_display_size,
                                                model_matrix(obj), f"the crop box {box.name}")
    return {"model": obj[SESSION_KEY], "crop": crop, "time": scene_time(scene)}


def scene_time(scene) -> float:
    """The time a 4D model is shown at in `scene`: its current frame's in the scene's frame range, which a 4D
    model's captured frames span."""
    return frame_time(scene.frame_current, scene.frame_start, scene.frame_end)


def active_model(context):
    """The model object that is active, or whose crop box is; or None."""
    obj = context.active_object
    if obj is not None and CROP_KEY in obj and obj.parent is not None:
        obj = obj.parent
    return obj if obj is not None and SESSION_KEY in obj else None


def problem(obj, scene) -> str:
    """Why `obj`'s splats are not drawn in `scene`, or ''."""
    from . import overlay  # here: it imports this module
    try:
        uniform_scale(model_matrix(obj), obj.name)
        model_choice(obj, scene)
    except SplatwrightError as e:
        return str(e)
    return not_connected() or overlay.refusal(obj.name)


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
            placed = [o.name for o in splat_objects(scene) if o[SESSION_KEY] == session]
            obj = add_model_object(view_layer, collection, session, centre, half_size)
            composite.prepare(scene)
            again = (f", which the scene already held as {', '.join(placed)} (delete {obj.name} if one copy is "
                     "enough)") if placed else ""
            return (f"added {obj.name}, the model of session {session}{again}; final renders composite it through "
                    "the scene's compositor")
        live.backend.call("add_model", bounds, add)
        return {"FINISHED"}


class SPLATWRIGHT_OT_add_crop_box(Guarded, Operator):
    """Crop the active splat object's model to a box: only the splats whose centres lie inside it are drawn,
    rendered and exported. Move, turn and scale the box (its axes may differ) to choose what is kept"""
    bl_idname = "splatwright.add_crop_box"
    bl_label = "Add Crop Box"

    @classmethod
    def blocked(cls, context):
        obj = active_model(context)
        if obj is None:
            return "Select a splat object"  # as Show Model says: the panel shows it once
        box = crop_box(obj)
        return f"{obj.name} has a crop box, {box.name}: move or scale it" if box is not None else ""

    def execute(self, context):
        obj = active_model(context)
        box = add_crop_box(context.view_layer, obj)
        self.report({"INFO"}, f"added {box.name}: {obj.name} shows the splats inside it")
        return {"FINISHED"}


def add_crop_box(view_layer, obj):
    """A crop box around model object `obj`'s model (its cube at first), parented to it, selected and active."""
    box = bpy.data.objects.new(f"{obj.name} Crop Box", None)
    box.empty_display_type = "CUBE"
    box.empty_display_size = obj.empty_display_size
    box[CROP_KEY] = True
    box.parent = obj  # at the object's origin, moving with it
    for collection in obj.users_collection:
        collection.objects.link(box)
    select_only(view_layer, box)
    return box


def select_only(view_layer, obj) -> None:
    """Make `obj` the one selected object and the active one (unless its collection is excluded from the view
    layer: then it stays unselected)."""
    for other in view_layer.objects.selected:
        other.select_set(False)
    try:
        obj.select_set(True, view_layer=view_layer)
        view_layer.objects.active = obj
    except RuntimeError:
        pass


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


def add_model_object(view_layer, collection, session: str, centre, half_size: float):
    """The Empty that places session `session`'s model, at its centre, selected and active."""
    obj = bpy.data.objects.new(session, None)
    obj.empty_display_type = "CUBE"
    obj.empty_display_size = half_size
    obj.location = [float(c) for c in centre]  # so the model stays where it was trained
    obj[SESSION_KEY] = session
    obj[CENTRE_KEY] = [float(c) for c in centre]
    collection.objects.link(obj)
    select_only(view_layer, obj)
    return obj


class SPLATWRIGHT_PT_scene_splats(SplatsPanel, bpy.types.Panel):
    bl_label = "Splats in the Scene"

    def draw(self, context):
        layout = self.layout
        buttons(layout, context, SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_show_model, SPLATWRIGHT_OT_add_crop_box,
                icons=("OUTLINER_OB_EMPTY", "HIDE_OFF", "MESH_CUBE"))
        for obj in splat_objects(context.scene):
            layout.label(text=f"{obj.name}: session {obj[SESSION_KEY]}", icon="OUTLINER_OB_EMPTY")
            if (box := crop_box(obj)) is not None:
                layout.label(text=f"cropped to {box.name}", icon="MESH_CUBE")
            if reason := problem(obj, context.scene):
                labels(layout, context, reason, icon="INFO")


CLASSES = (SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_show_model, SPLATWRIGHT_OT_add_crop_box,
           SPLATWRIGHT_PT_scene_splats)
register, unregister = bpy.utils.register_classes_factory(CLASSES)

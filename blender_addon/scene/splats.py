"""Splat models as objects of the scene: Add Model to Scene puts the backend's model of the open session in the
scene as an Empty (a cube around the model) named after the session. Its transform places the splats in every
view and final render (logic/placement.py), hiding it or leaving it out of renders hides them, deleting it removes
them. The link is two custom properties of the object, saved with the .blend: the session and the point of the
model at the object's origin. Each object shows its session's model (the open session's as it trains, another
session's as it was last saved), so a scene may hold several, of one session or more.

Add Crop Box parents a cube-shaped Empty to the model object (marked by a custom property): only the splats
whose centres lie inside it are drawn, rendered and exported. It may be moved, turned and scaled unevenly. The
backend crops an Empty's splats; a native object is cropped by a Geometry Nodes modifier (native.crop_to), so
Blender draws, renders and exports what it keeps."""
from __future__ import annotations

import bpy
import numpy as np

from ..core.cameras import Camera
from ..logic.dataset import frame_time
from ..logic.native import POSITION, fingerprint
from ..logic.placement import camera_in_model, crop_matrix, model_bounds, model_to_world
from . import native

SESSION_KEY = "splatwright_session"  # the session whose model the object places ('': a linked file's, of none)
CENTRE_KEY = "splatwright_centre"  # the model-space point at the object's origin
STEP_KEY = "splatwright_step"  # on a native splat object: the training step of the model it holds
# On a native splat object: logic/native.fingerprint of the points last written into it (or sent from it to train
# on), which its points as Blender evaluates them differ from once they are edited (hidden in the UI: a leading _).
FINGERPRINT_KEY = "_splatwright_fingerprint"
CROP_KEY = "splatwright_crop_box"  # on a cube-shaped Empty parented to a model object: the box it is cropped to


def splat_objects(scene) -> list:
    """The scene's objects that place a splat model, by name: Empties whose splats the backend draws, and
    native splat objects (Blender 5.3 and later) that Blender draws itself."""
    return sorted((o for o in scene.objects if SESSION_KEY in o), key=lambda o: o.name)


def streamed_objects(scene) -> list:
    """The splat objects whose splats the backend draws (into the viewport and final renders), by name."""
    return [o for o in splat_objects(scene) if o.type == "EMPTY"]


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


def add_crop_box(view_layer, obj):
    """A crop box around model object `obj`'s model (its cube at first; a native object's: the box around its
    points, which its crop modifier keeps: native.crop_to), parented to it, selected and active."""
    box = bpy.data.objects.new(f"{obj.name} Crop Box", None)
    box.empty_display_type = "CUBE"
    box[CROP_KEY] = True
    box.parent = obj  # at the object's origin, moving with it
    if obj.type == "EMPTY":
        box.empty_display_size = obj.empty_display_size
    else:  # the points it holds, or those of the file it shows
        cloud = obj.evaluated_get(bpy.context.evaluated_depsgraph_get()).data if native.linked_path(obj) else obj.data
        centre, box.empty_display_size = model_bounds(native.positions(cloud))
        box.location = [float(c) for c in centre]
        native.crop_to(obj, box)
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


def add_model_object(view_layer, collection, session: str, centre, half_size: float):
    """The Empty that places session `session`'s model, at its centre, selected and active."""
    obj = bpy.data.objects.new(session, None)
    obj.empty_display_type = "CUBE"
    obj.empty_display_size = half_size
    return placed_at_centre(view_layer, collection, obj, session, centre)


def add_native_object(view_layer, collection, session: str, attributes: dict, step: int):
    """A native splat object (Blender 5.3 and later) holding session `session`'s model of training step `step`
    as `attributes` (logic/native.to_attributes) where it was trained, selected and active. Its points are
    the model's means as they are; Blender's own tools may move its origin."""
    cloud = bpy.data.pointclouds.new(session)
    native.write(cloud, attributes)
    obj = bpy.data.objects.new(session, cloud)
    obj[STEP_KEY], obj[FINGERPRINT_KEY] = step, fingerprint(attributes[POSITION])
    return placed_at_centre(view_layer, collection, obj, session, (0.0, 0.0, 0.0))


def add_linked_object(view_layer, collection, name: str, path: str):
    """A native splat object (Blender 5.3 and later) named `name` that shows splat file `path` (native.link_file)
    and belongs to no session, selected and active."""
    obj = bpy.data.objects.new(name, bpy.data.pointclouds.new(name))
    native.link_file(obj, path)
    return placed_at_centre(view_layer, collection, obj, "", (0.0, 0.0, 0.0))


def placed_at_centre(view_layer, collection, obj, session: str, centre):
    """`obj` linked to session `session`'s model, placed so the model stays where it was trained."""
    obj.location = [float(c) for c in centre]
    obj[SESSION_KEY] = session
    obj[CENTRE_KEY] = [float(c) for c in centre]
    collection.objects.link(obj)
    select_only(view_layer, obj)
    return obj

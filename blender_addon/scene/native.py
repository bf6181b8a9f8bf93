"""Blender's native splats (5.3 and later): a point cloud of type GAUSSIAN_SPLAT holds a model as point
attributes (logic/native.py says which), which EEVEE and Cycles draw with the scene's meshes."""
from __future__ import annotations

import bpy
import numpy as np

from ..core.errors import SplatwrightError
from ..logic.dataset import frame_time
from ..logic.native import (ACCELERATION, ANGULAR_VELOCITY, BASE, CENTRE_OPACITY, MOTION_ATTRIBUTES, NATIVE_TYPE,
                            POSITION, ROTATION, SCALE, SH_PREFIX, TIME_CENTER, TIME_PRECISION, VELOCITY,
                            attribute_kind, file_import_node, opacity_at)

MODEL_ATTRIBUTES = (POSITION, SCALE, ROTATION, BASE)
WRITTEN_KEY = "_splatwright_written"  # on a native cloud: how many attribute writes write() made (hidden in the UI)


def available() -> bool:
    """Whether this Blender draws Gaussian splats itself."""
    kind = bpy.types.PointCloud.bl_rna.properties.get("type")
    return kind is not None and NATIVE_TYPE in kind.enum_items.keys()


def write(cloud, attributes: dict[str, np.ndarray]) -> None:
    """Make point cloud `cloud` hold a model's attributes (logic/native.to_attributes): as many points, the
    attributes of its SH degree and no others."""
    for _ in writing(cloud, attributes):
        pass


def writing(cloud, attributes: dict[str, np.ndarray]):
    """write() in steps, one attribute each, for a caller that spreads them over timer ticks (a million
    points' attribute takes tens of milliseconds)."""
    count = len(attributes[POSITION])
    cloud.type = NATIVE_TYPE
    if len(cloud.points) != count:
        cloud.resize(count)
    for attribute in [a for a in cloud.attributes if (a.name.startswith(SH_PREFIX) or a.name in MOTION_ATTRIBUTES)
                      and a.name not in attributes]:
        cloud.attributes.remove(attribute)
    for name, values in attributes.items():
        yield
        kind = attribute_kind(name)
        attribute = cloud.attributes.get(name)
        if attribute is not None and (attribute.data_type != kind.data_type or attribute.domain != "POINT"):
            cloud.attributes.remove(attribute)
            attribute = None
        if attribute is None:
            attribute = cloud.attributes.new(name, kind.data_type, "POINT")
        attribute.data.foreach_set(kind.field, values.ravel())
        cloud[WRITTEN_KEY] = cloud.get(WRITTEN_KEY, 0) + 1  # set_opacities' copy of the cloud is stale
        cloud.update_tag()


def positions(cloud) -> np.ndarray:
    """The points' positions (n, 3) of point cloud `cloud`."""
    values = np.empty(len(cloud.points) * 3, np.float32)
    if len(values):
        cloud.attributes[POSITION].data.foreach_get("vector", values)
    return values.reshape(-1, 3)


def read(cloud) -> dict[str, np.ndarray]:
    """The model attributes a native splat cloud holds now (as Blender's own tools left them)."""
    attributes = {}
    for attribute in cloud.attributes:
        if attribute.domain == "POINT" and (attribute.name in MODEL_ATTRIBUTES or attribute.name.startswith(SH_PREFIX)):
            kind = attribute_kind(attribute.name)
            values = np.empty(len(cloud.points) * kind.width, np.float32)
            attribute.data.foreach_get(kind.field, values)
            attributes[attribute.name] = values.reshape(-1, kind.width)
    return attributes


def shown_attributes(context, obj, cropped: bool = True) -> dict[str, np.ndarray]:
    """The attributes of what native splat object `obj` shows, as Blender evaluates it (edits and modifiers
    included); without its crop box unless `cropped`."""
    if cropped:
        return read(obj.evaluated_get(context.evaluated_depsgraph_get()).data)
    with uncropped(obj):
        return read(obj.evaluated_get(context.evaluated_depsgraph_get()).data)


# ---- the crop box: a Geometry Nodes modifier that keeps the points inside a box ----

CROP_MODIFIER = "Splatwright Crop"  # the modifier's name, and its node group's
CROP_GROUP_KEY = "splatwright_crop"  # on the node group: the version of the tree it holds (made again if older)
CROP_GROUP_VERSION = 1
BOX_INPUT, SIZE_INPUT = "Box", "Size"


def geometry_group(name: str, key: str, version: int, inputs: dict[str, str]):
    """The Geometry Nodes group marked `key` = `version` (the add-on's, of this version), and False; or a new one
    with a geometry input, `inputs` (name: socket type) and a geometry output, and True: its nodes are the
    caller's to add."""
    group = next((g for g in bpy.data.node_groups if g.get(key) == version and g.bl_idname == "GeometryNodeTree"),
                 None)
    if group is not None:
        return group, False
    group = bpy.data.node_groups.new(name, "GeometryNodeTree")
    group[key] = version
    face = group.interface
    face.new_socket("Geometry", in_out="INPUT", socket_type="NodeSocketGeometry")
    for socket, kind in inputs.items():
        face.new_socket(socket, in_out="INPUT", socket_type=kind)
    face.new_socket("Geometry", in_out="OUTPUT", socket_type="NodeSocketGeometry")
    return group, True


def add_node(group, kind: str, location: tuple[float, float], settings: dict):
    """A new node of `kind` in `group` at `location`, its properties set from `settings`."""
    n = group.nodes.new(kind)
    n.location = location
    for name, value in settings.items():
        setattr(n, name, value)
    return n


def crop_group():
    """The node group that keeps a point cloud's points whose positions lie in a cube-shaped Empty (input `Box`,
    its display size `Size` half its side) and deletes the others; a missing box or one of no size keeps them
    all. Inside means every axis of the point in the box's own space within [-Size, Size]: the backend's crop
    (backend/placement.py, logic/placement.crop_matrix) in the box's units."""
    group, made = geometry_group(CROP_MODIFIER, CROP_GROUP_KEY, CROP_GROUP_VERSION,
                                 {BOX_INPUT: "NodeSocketObject", SIZE_INPUT: "NodeSocketFloat"})
    if not made:
        return group
    link = group.links.new

    def node(kind: str, x: float, **settings):
        return add_node(group, kind, (x, 0.0), settings)
    given, out = node("NodeGroupInput", -1200), node("NodeGroupOutput", 600)
    box = node("GeometryNodeObjectInfo", -1000, transform_space="RELATIVE")  # the box in the object's space
    invert = node("FunctionNodeInvertMatrix", -800)
    position = node("GeometryNodeInputPosition", -800)
    to_box = node("FunctionNodeTransformPoint", -600)
    absolute = node("ShaderNodeVectorMath", -400, operation="ABSOLUTE")
    axes = node("ShaderNodeSeparateXYZ", -200)
    xy = node("ShaderNodeMath", 0, operation="MAXIMUM")
    xyz = node("ShaderNodeMath", 100, operation="MAXIMUM")
    outside = node("FunctionNodeCompare", 200, data_type="FLOAT", operation="GREATER_THAN")
    sized = node("FunctionNodeCompare", 200, data_type="FLOAT", operation="GREATER_THAN")
    sized.inputs["B"].default_value = 0.0
    both = node("FunctionNodeBooleanMath", 300, operation="AND")
    cropping = node("FunctionNodeBooleanMath", 350, operation="AND")
    delete = node("GeometryNodeDeleteGeometry", 450, domain="POINT")
    link(given.outputs[BOX_INPUT], box.inputs["Object"])
    link(box.outputs["Transform"], invert.inputs["Matrix"])
    link(invert.outputs["Matrix"], to_box.inputs["Transform"])
    link(position.outputs["Position"], to_box.inputs["Vector"])
    link(to_box.outputs["Vector"], absolute.inputs[0])
    link(absolute.outputs["Vector"], axes.inputs["Vector"])
    link(axes.outputs["X"], xy.inputs[0])
    link(axes.outputs["Y"], xy.inputs[1])
    link(xy.outputs["Value"], xyz.inputs[0])
    link(axes.outputs["Z"], xyz.inputs[1])
    link(xyz.outputs["Value"], outside.inputs["A"])
    link(given.outputs[SIZE_INPUT], outside.inputs["B"])
    link(given.outputs[SIZE_INPUT], sized.inputs["A"])  # a removed box's size driver gives 0: nothing is cropped
    link(outside.outputs["Result"], both.inputs[0])
    link(sized.outputs["Result"], both.inputs[1])
    link(both.outputs["Boolean"], cropping.inputs[0])
    link(invert.outputs["Invertible"], cropping.inputs[1])
    link(given.outputs["Geometry"], delete.inputs["Geometry"])
    link(cropping.outputs["Boolean"], delete.inputs["Selection"])
    link(delete.outputs["Geometry"], out.inputs["Geometry"])
    return group


def _input(modifier, name: str):
    """The modifier's input of the node group's socket `name` (its value is `.value`)."""
    identifier = next(item.identifier for item in modifier.node_group.interface.items_tree
                      if getattr(item, "in_out", "") == "INPUT" and item.name == name)
    return getattr(modifier.properties.inputs, identifier)


def crop_modifier(obj):
    """The crop modifier of native splat object `obj`, or None."""
    modifier = obj.modifiers.get(CROP_MODIFIER)
    return modifier if modifier is not None and modifier.type == "NODES" else None


def crop_to(obj, box) -> None:
    """Crop native splat object `obj` to cube-shaped Empty `box`: a Geometry Nodes modifier (first in the stack,
    or after the file modifier and a 4D model's motion, so later modifiers see the cropped points) keeps the points
    inside it, the box's display size followed by a driver. Blender's viewport, EEVEE and Cycles draw the points
    kept, and Export Splats writes them."""
    modifier = crop_modifier(obj)
    if modifier is None:
        modifier = obj.modifiers.new(CROP_MODIFIER, "NODES")
        # after the file a model is kept in, and a 4D model's motion (its points at the time)
        first = (file_modifier(obj) is not None) + (motion_modifier(obj) is not None)
        if len(obj.modifiers) > first + 1:
            obj.modifiers.move(len(obj.modifiers) - 1, first)
            modifier = obj.modifiers[first]
    modifier.node_group = crop_group()
    _input(modifier, BOX_INPUT).value = box
    size = _input(modifier, SIZE_INPUT)
    size.driver_remove("value")
    driver = size.driver_add("value").driver
    driver.type = "SUM"
    variable = driver.variables.new()
    variable.type = "SINGLE_PROP"
    variable.targets[0].id = box
    variable.targets[0].data_path = "empty_display_size"
    obj.update_tag()


class uncropped:
    """While in this context, native splat object `obj` shows its points without its crop box (its crop
    modifier off in the viewport's evaluation)."""

    def __init__(self, obj):
        self.modifier = crop_modifier(obj)
        self.shown = self.modifier is not None and self.modifier.show_viewport

    def __enter__(self):
        if self.shown:
            self.modifier.show_viewport = False

    def __exit__(self, *exc):
        if self.shown:
            self.modifier.show_viewport = True


# ---- a model kept in a file outside the .blend: a Geometry Nodes modifier imports it ----

FILE_MODIFIER = "Splatwright File"  # the modifier's name; its node groups' are this and the format's
FILE_GROUP_KEY = "splatwright_file"  # on a node group: the version of the tree it holds (made again if older)
FILE_GROUP_VERSION = 1
PATH_INPUT = "Path"


def file_group(node_kind: str):
    """The node group whose output is the splat file at its input `Path`, read by Geometry Nodes node `node_kind`
    (logic/native.FILE_IMPORT_NODES: Import PLY or Import SPZ, which make a GAUSSIAN_SPLAT point cloud in Blender's
    attribute conventions and resolve a Blender-relative `//` path against the .blend's folder); its geometry input
    is left out. A file that is missing or unreadable gives no points, and the node's warning."""
    key = f"{FILE_GROUP_KEY}:{node_kind}"
    group, made = geometry_group(f"{FILE_MODIFIER} {node_kind.removeprefix('GeometryNodeImport')}", key,
                                 FILE_GROUP_VERSION, {PATH_INPUT: "NodeSocketString"})
    if not made:
        return group
    next(item for item in group.interface.items_tree
         if getattr(item, "in_out", "") == "INPUT" and item.name == PATH_INPUT).subtype = "FILE_PATH"
    given = add_node(group, "NodeGroupInput", (-400.0, 0.0), {})
    out = add_node(group, "NodeGroupOutput", (200.0, 0.0), {})
    reader = add_node(group, node_kind, (-100.0, 0.0), {})
    group.links.new(given.outputs[PATH_INPUT], reader.inputs["Path"])
    group.links.new(reader.outputs[0], out.inputs["Geometry"])  # "Geometry" of Import PLY, "Points" of Import SPZ
    return group


def first_modifier(obj, name: str):
    """A new Geometry Nodes modifier `name` of `obj`, first in its stack (its points are made or moved before a
    crop box or the user's modifiers see them)."""
    modifier = obj.modifiers.new(name, "NODES")
    if len(obj.modifiers) > 1:
        obj.modifiers.move(len(obj.modifiers) - 1, 0)
        modifier = obj.modifiers[0]
    return modifier


def file_modifier(obj):
    """The file modifier of native splat object `obj`, or None (its own point cloud holds its model)."""
    modifier = obj.modifiers.get(FILE_MODIFIER)
    return modifier if modifier is not None and modifier.type == "NODES" and modifier.node_group is not None else None


def linked_path(obj) -> str:
    """The splat file native splat object `obj` shows, as it keeps it (relative to the .blend's folder, `//...`, or
    absolute); '' where its own point cloud holds its model."""
    modifier = file_modifier(obj) if obj.type == "POINTCLOUD" else None
    return _input(modifier, PATH_INPUT).value if modifier is not None else ""


def link_file(obj, path: str) -> None:
    """Make native splat object `obj` show splat file `path` (a 3DGS PLY or an SPZ) and hold none itself: its point
    cloud becomes an empty one of its own (with its materials; other objects that shared the old one keep it), and
    the file modifier, first in its stack (before a crop box's and any other), imports the file at each
    evaluation. The .blend then keeps only the path. SplatwrightError for a file the nodes cannot read."""
    node_kind = file_import_node(path)
    old = obj.data
    cloud = bpy.data.pointclouds.new(old.name)
    cloud.type = NATIVE_TYPE
    for material in old.materials:
        cloud.materials.append(material)
    obj.data = cloud
    if old.users == 0:
        bpy.data.pointclouds.remove(old)
    modifier = file_modifier(obj) or first_modifier(obj, FILE_MODIFIER)
    modifier.node_group = file_group(node_kind)
    _input(modifier, PATH_INPUT).value = path
    obj.update_tag()


def file_warning(obj) -> str:
    """What the file modifier of native splat object `obj` said when it last imported its file (Blender's node
    warning: the file missing or unreadable), or ''."""
    modifier = file_modifier(obj)
    return next((w.message for w in modifier.node_warnings), "") if modifier is not None else ""


def store_file(context, obj) -> int:
    """Make native splat object `obj`, which shows a file, hold the file's splats in its own point cloud (as the
    file modifier imports them, before the modifiers after it) and remove the modifier; the number of splats.
    SplatwrightError where the file gives none (missing or unreadable)."""
    modifier = file_modifier(obj)
    later = [m for m in obj.modifiers[obj.modifiers.find(modifier.name) + 1:] if m.show_viewport]
    for m in later:
        m.show_viewport = False
    try:
        attributes = read(obj.evaluated_get(context.evaluated_depsgraph_get()).data)
    finally:
        for m in later:
            m.show_viewport = True
    if not len(attributes.get(POSITION, ())):
        raise SplatwrightError(f"{linked_path(obj)} gives {obj.name} no splats ({file_warning(obj) or 'empty'}): "
                               "put the file back, or set the Path of its Splatwright File modifier")
    write(obj.data, attributes)
    obj.modifiers.remove(modifier)
    obj.update_tag()
    return len(attributes[POSITION])


# ---- 4D models: a Geometry Nodes modifier moves and turns the points at the scene's time; opacities by a handler ----

MOTION_MODIFIER = "Splatwright Motion"  # the modifier's name, and its node group's
MOTION_GROUP_KEY = "splatwright_motion"  # on the node group: the version of the tree it holds (made again if older)
MOTION_GROUP_VERSION = 2
START_INPUT, END_INPUT = "Start", "End"


def moving(cloud) -> bool:
    """Whether point cloud `cloud` holds a 4D model (logic/native.motion_attributes)."""
    return cloud.attributes.get(TIME_CENTER) is not None


def motion_group():
    """The node group that shows a 4D model's points at the scene's time t: the scene's frame (with its subframe,
    Scene Time) in the frame range [Start, End] as logic/dataset.frame_time maps it (clamped to [0, 1], 0 for a
    range of one frame), and with dt = t - time centre, as backend/dynamic.reference_motion: position + velocity dt
    + acceleration dt^2 / 2, and the rotation turned in world space by the rotation vector angular velocity * dt
    (about the axis of the angular velocity by |angular velocity| dt; building that quaternion from sine and
    cosine nodes cost the evaluation 2 ms more at 500k points). The opacity (radiance:base's fourth value) is not
    here: Geometry Nodes reads and writes four-value attributes only as their first three (Blender 5.3), so a
    frame handler (update_opacities) sets it."""
    group, made = geometry_group(MOTION_MODIFIER, MOTION_GROUP_KEY, MOTION_GROUP_VERSION,
                                 {START_INPUT: "NodeSocketFloat", END_INPUT: "NodeSocketFloat"})
    if not made:
        return group
    link = group.links.new
    column = [0]

    def node(kind: str, **settings):
        column[0] += 1
        return add_node(group, kind, (200.0 * (column[0] // 4), -200.0 * (column[0] % 4)), settings)

    def math(operation: str, a, b=None, **settings):
        n = node("ShaderNodeMath", operation=operation, **settings)
        for i, value in enumerate((a, b)):
            if value is None:
                continue
            if isinstance(value, (int, float)):
                n.inputs[i].default_value = value
            else:
                link(value, n.inputs[i])
        return n.outputs[0]

    def vector(operation: str, a, b=None, scale=None):
        n = node("ShaderNodeVectorMath", operation=operation)
        link(a, n.inputs[0])
        if b is not None:
            link(b, n.inputs[1])
        if scale is not None:
            link(scale, n.inputs["Scale"])
        return n.outputs["Value" if operation == "LENGTH" else "Vector"]

    def named(name: str, data_type: str):
        n = node("GeometryNodeInputNamedAttribute", data_type=data_type)
        n.inputs["Name"].default_value = name
        return n.outputs["Attribute"]

    given, out = node("NodeGroupInput"), node("NodeGroupOutput")
    frame = node("GeometryNodeInputSceneTime").outputs["Frame"]
    span = math("SUBTRACT", given.outputs[END_INPUT], given.outputs[START_INPUT])
    time = math("DIVIDE", math("SUBTRACT", frame, given.outputs[START_INPUT]), span, use_clamp=True)  # x/0 is 0
    dt = math("SUBTRACT", time, named(TIME_CENTER, "FLOAT"))
    half_dt2 = math("MULTIPLY", math("MULTIPLY", dt, dt), 0.5)
    moved = vector("ADD", vector("ADD", node("GeometryNodeInputPosition").outputs["Position"],
                                 vector("SCALE", named(VELOCITY, "FLOAT_VECTOR"), scale=dt)),
                   vector("SCALE", named(ACCELERATION, "FLOAT_VECTOR"), scale=half_dt2))
    angular = named(ANGULAR_VELOCITY, "FLOAT_VECTOR")
    turn = node("FunctionNodeAxisAngleToRotation")  # a zero axis turns by an angle of 0: not at all
    link(angular, turn.inputs["Axis"])
    link(math("MULTIPLY", vector("LENGTH", angular), dt), turn.inputs["Angle"])
    turned = node("FunctionNodeRotateRotation", rotation_space="GLOBAL")  # Rotate By times Rotation
    link(named(ROTATION, "QUATERNION"), turned.inputs["Rotation"])
    link(turn.outputs[0], turned.inputs["Rotate By"])
    place = node("GeometryNodeSetPosition")
    store = node("GeometryNodeStoreNamedAttribute", data_type="QUATERNION", domain="POINT")
    store.inputs["Name"].default_value = ROTATION
    link(given.outputs["Geometry"], place.inputs["Geometry"])
    link(moved, place.inputs["Position"])
    link(place.outputs["Geometry"], store.inputs["Geometry"])
    link(turned.outputs[0], store.inputs["Value"])
    link(store.outputs["Geometry"], out.inputs["Geometry"])
    return group


def motion_modifier(obj):
    """The motion modifier of native splat object `obj`, or None."""
    modifier = obj.modifiers.get(MOTION_MODIFIER)
    return modifier if modifier is not None and modifier.type == "NODES" else None


def animate(obj, scene) -> None:
    """Make native splat object `obj`, holding a 4D model, show it at `scene`'s time: the motion modifier first in
    its stack (a crop box then crops the points where they are at that time), its frame range followed by drivers,
    and its opacities set now (update_opacities sets them at each frame change)."""
    modifier = motion_modifier(obj) or first_modifier(obj, MOTION_MODIFIER)
    modifier.node_group = motion_group()
    for name, path in ((START_INPUT, "frame_start"), (END_INPUT, "frame_end")):
        value = _input(modifier, name)
        value.driver_remove("value")
        driver = value.driver_add("value").driver
        driver.type = "SUM"
        variable = driver.variables.new()
        variable.type = "SINGLE_PROP"
        variable.targets[0].id_type = "SCENE"
        variable.targets[0].id = scene
        variable.targets[0].data_path = path
    set_opacities(obj.data, scene_time(scene))
    obj.update_tag()


def scene_time(scene) -> float:
    """The time a 4D model is shown at in `scene`: its frame (with the subframe) in its frame range (dataset.frame_time,
    which the motion node group computes too)."""
    return frame_time(scene.frame_current + scene.frame_subframe, scene.frame_start, scene.frame_end)


def _values(cloud, name: str) -> np.ndarray:
    kind = attribute_kind(name)
    values = np.empty(len(cloud.points) * kind.width, np.float32)
    cloud.attributes[name].data.foreach_get(kind.field, values)
    return values.reshape(-1, kind.width) if kind.width > 1 else values


class _Kept:
    """What set_opacities keeps of a 4D cloud between frames, so that a frame change reads nothing back from
    Blender (a read after the depsgraph evaluated the cloud can cost more than the write): radiance:base as last
    written, and the opacities' time windows. Good while the cloud holds as many points and its WRITTEN_KEY."""
    __slots__ = ("count", "written", "base", "centre", "time_centers", "precisions")

    def __init__(self, cloud):
        self.count, self.written = len(cloud.points), cloud.get(WRITTEN_KEY)
        self.base = _values(cloud, BASE)
        self.centre, self.time_centers, self.precisions = (_values(cloud, name) for name in
                                                           (CENTRE_OPACITY, TIME_CENTER, TIME_PRECISION))


_kept: dict[int, _Kept] = {}  # by the cloud's session_uid


def set_opacities(cloud, time: float) -> None:
    """Set 4D point cloud `cloud`'s opacities (radiance:base's fourth value) to those at `time`: radiance:base
    written whole from the copy kept of it, and not at all where no opacity changes (the same time again, or
    Gaussians without a time window)."""
    if not len(cloud.points):
        return
    kept = _kept.get(cloud.session_uid)
    if kept is None or kept.count != len(cloud.points) or kept.written != cloud.get(WRITTEN_KEY):
        kept = _kept[cloud.session_uid] = _Kept(cloud)
    opacities = opacity_at(time, kept.centre, kept.time_centers, kept.precisions)
    if np.array_equal(opacities, kept.base[:, 3]):
        return
    kept.base[:, 3] = opacities
    cloud.attributes[BASE].data.foreach_set("vector", kept.base.ravel())
    cloud.update_tag()


@bpy.app.handlers.persistent
def update_opacities(scene, depsgraph=None) -> None:
    """Before each frame change (scrubbing, playback, renders): the opacities of the scene's 4D splat objects at
    its time. Objects that share a cloud are set once."""
    time, done = scene_time(scene), set()
    for obj in scene.objects:
        cloud = obj.data
        if obj.type == "POINTCLOUD" and cloud.session_uid not in done and motion_modifier(obj) is not None \
                and moving(cloud):
            done.add(cloud.session_uid)
            set_opacities(cloud, time)
    if len(_kept) > len(done):  # forget the clouds that went away
        present = {cloud.session_uid for cloud in bpy.data.pointclouds}
        for uid in [uid for uid in _kept if uid not in present]:
            del _kept[uid]


def register():
    if update_opacities not in bpy.app.handlers.frame_change_pre:
        bpy.app.handlers.frame_change_pre.append(update_opacities)


def unregister():
    if update_opacities in bpy.app.handlers.frame_change_pre:
        bpy.app.handlers.frame_change_pre.remove(update_opacities)
    _kept.clear()

"""Blender's native splats (5.3 and later): a point cloud of type GAUSSIAN_SPLAT holds a model as point
attributes (logic/native.py says which), which EEVEE and Cycles draw with the scene's meshes."""
from __future__ import annotations

import bpy
import numpy as np

from ..logic.native import BASE, NATIVE_TYPE, POSITION, ROTATION, SCALE, SH_PREFIX, attribute_kind

MODEL_ATTRIBUTES = (POSITION, SCALE, ROTATION, BASE)


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
    for attribute in [a for a in cloud.attributes if a.name.startswith(SH_PREFIX) and a.name not in attributes]:
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


# ---- the crop box: a Geometry Nodes modifier that keeps the points inside a box ----

CROP_MODIFIER = "Splatwright Crop"  # the modifier's name, and its node group's
CROP_GROUP_KEY = "splatwright_crop"  # on the node group: the version of the tree it holds (made again if older)
CROP_GROUP_VERSION = 1
BOX_INPUT, SIZE_INPUT = "Box", "Size"


def crop_group():
    """The node group that keeps a point cloud's points whose positions lie in a cube-shaped Empty (input `Box`,
    its display size `Size` half its side) and deletes the others; a missing box or one of no size keeps them
    all. Inside means every axis of the point in the box's own space within [-Size, Size]: the backend's crop
    (backend/placement.py, logic/placement.crop_matrix) in the box's units."""
    group = next((g for g in bpy.data.node_groups
                  if g.get(CROP_GROUP_KEY) == CROP_GROUP_VERSION and g.bl_idname == "GeometryNodeTree"), None)
    if group is not None:
        return group
    group = bpy.data.node_groups.new(CROP_MODIFIER, "GeometryNodeTree")
    group[CROP_GROUP_KEY] = CROP_GROUP_VERSION
    face = group.interface
    face.new_socket("Geometry", in_out="INPUT", socket_type="NodeSocketGeometry")
    face.new_socket(BOX_INPUT, in_out="INPUT", socket_type="NodeSocketObject")
    face.new_socket(SIZE_INPUT, in_out="INPUT", socket_type="NodeSocketFloat")
    face.new_socket("Geometry", in_out="OUTPUT", socket_type="NodeSocketGeometry")
    nodes, link = group.nodes, group.links.new

    def node(kind: str, x: float, **settings):
        n = nodes.new(kind)
        n.location = (x, 0.0)
        for name, value in settings.items():
            setattr(n, name, value)
        return n
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
    so later modifiers see the cropped points) keeps the points inside it, the box's display size followed by a
    driver. Blender's viewport, EEVEE and Cycles draw the points kept, and Export Splats writes them."""
    modifier = crop_modifier(obj)
    if modifier is None:
        modifier = obj.modifiers.new(CROP_MODIFIER, "NODES")
        if len(obj.modifiers) > 1:
            obj.modifiers.move(len(obj.modifiers) - 1, 0)
            modifier = obj.modifiers[0]
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

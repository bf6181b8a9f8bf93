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

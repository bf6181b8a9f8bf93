"""Blender's native Gaussian splats (5.3 and later: a point cloud of type GAUSSIAN_SPLAT, drawn by EEVEE and
Cycles) as a splat model's parameters, in the conventions of Blender's own PLY importer (checked against it):
`position`; `scale` = exp(log-scale); `rotation` the unit quaternion (w, x, y, z); `radiance:base` the raw DC
coefficients and sigmoid(opacity); `radiance:sh_k` the k-th coefficient after DC, as RGB."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.splats import SplatArrays

NATIVE_TYPE = "GAUSSIAN_SPLAT"
POSITION, SCALE, ROTATION, BASE = "position", "scale", "rotation", "radiance:base"
SH_PREFIX = "radiance:sh_"
OPACITY_LIMIT = 1e-7  # opacities are kept this far inside (0, 1) so their logits stay finite


@dataclass(frozen=True)
class AttributeKind:
    data_type: str  # Blender's attribute data type
    field: str  # the field foreach_get/foreach_set read and write
    width: int


KINDS = {"FLOAT_VECTOR": AttributeKind("FLOAT_VECTOR", "vector", 3),
         "QUATERNION": AttributeKind("QUATERNION", "value", 4),
         "FLOAT4": AttributeKind("FLOAT4", "vector", 4)}


def sh_attribute(k: int) -> str:
    return f"{SH_PREFIX}{k}"


def attribute_kind(name: str) -> AttributeKind:
    return KINDS["QUATERNION" if name == ROTATION else "FLOAT4" if name == BASE else "FLOAT_VECTOR"]


def to_attributes(model: SplatArrays, origin=(0.0, 0.0, 0.0)) -> dict[str, np.ndarray]:
    """The point attributes that show `model` natively, its positions relative to `origin` (the object's)."""
    opacity = 1.0 / (1.0 + np.exp(-model.opacity_logits.astype(np.float64)))
    quats = model.quats / np.maximum(np.linalg.norm(model.quats, axis=1, keepdims=True), 1e-12)
    attributes = {POSITION: model.means - np.asarray(origin, np.float32), SCALE: np.exp(model.log_scales),
                  ROTATION: quats, BASE: np.concatenate([model.sh_dc, opacity[:, None]], axis=1)}
    attributes.update({sh_attribute(k): model.sh_rest[:, k] for k in range(model.sh_rest.shape[1])})
    return {name: np.ascontiguousarray(values, np.float32) for name, values in attributes.items()}


def from_attributes(attributes: dict[str, np.ndarray], origin=(0.0, 0.0, 0.0)) -> SplatArrays:
    """The model a native splat object holds (the inverse of to_attributes), its positions moved by `origin`."""
    count = len(attributes[POSITION])
    k = 0
    while sh_attribute(k) in attributes:
        k += 1
    degree = round((k + 1) ** 0.5) - 1
    rest = [attributes[sh_attribute(i)] for i in range((degree + 1) ** 2 - 1)]
    opacity = np.clip(attributes[BASE][:, 3].astype(np.float64), OPACITY_LIMIT, 1.0 - OPACITY_LIMIT)
    return SplatArrays(
        means=(attributes[POSITION] + np.asarray(origin, np.float32)).astype(np.float32),
        log_scales=np.log(np.maximum(attributes[SCALE], 1e-30)).astype(np.float32),
        quats=attributes[ROTATION].astype(np.float32),
        opacity_logits=np.log(opacity / (1 - opacity)).astype(np.float32),
        sh_dc=attributes[BASE][:, :3].astype(np.float32),
        sh_rest=(np.stack(rest, axis=1) if rest else np.zeros((count, 0, 3))).astype(np.float32))

"""Blender's native Gaussian splats (5.3 and later: a point cloud of type GAUSSIAN_SPLAT, drawn by EEVEE and
Cycles) as a splat model's parameters, in the conventions of Blender's own PLY importer (checked against it):
`position`; `scale` = exp(log-scale); `rotation` the unit quaternion (w, x, y, z); `radiance:base` the raw DC
coefficients and sigmoid(opacity); `radiance:sh_k` the k-th coefficient after DC, as RGB.

A 4D model (backend/dynamic.py) is shown at the scene's time: its points hold its parameters at each Gaussian's
time centre in those attributes, and its motion in MOTION_ATTRIBUTES, which scene/native.py evaluates at each
frame exactly as DynamicGaussians.at does (motion_at here is that evaluation in numpy, the one its tests check)."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

import numpy as np

from ..core.errors import SplatwrightError
from ..core.splats import SplatArrays

NATIVE_TYPE = "GAUSSIAN_SPLAT"
POSITION, SCALE, ROTATION, BASE = "position", "scale", "rotation", "radiance:base"
SH_PREFIX = "radiance:sh_"
OPACITY_LIMIT = 1e-7  # opacities are kept this far inside (0, 1) so their logits stay finite


# a 4D model's motion, per point: what DynamicGaussians adds to the static parameters, and the opacity at the time
# centre (radiance:base's fourth value is the opacity at the scene's time)
VELOCITY, ACCELERATION, ANGULAR_VELOCITY = "splatwright:velocity", "splatwright:acceleration", "splatwright:angular_velocity"
TIME_CENTER, TIME_PRECISION, CENTRE_OPACITY = "splatwright:time_center", "splatwright:time_precision", "splatwright:opacity"
MOTION_VECTORS = (VELOCITY, ACCELERATION, ANGULAR_VELOCITY)
MOTION_ATTRIBUTES = (*MOTION_VECTORS, TIME_CENTER, TIME_PRECISION, CENTRE_OPACITY)
MOTION_FIELDS = {VELOCITY: "velocities", ACCELERATION: "accelerations", ANGULAR_VELOCITY: "angular_velocities",
                 TIME_CENTER: "time_centers", TIME_PRECISION: "time_precisions"}  # DynamicGaussians' names


@dataclass(frozen=True)
class AttributeKind:
    data_type: str  # Blender's attribute data type
    field: str  # the field foreach_get/foreach_set read and write
    width: int


KINDS = {"FLOAT_VECTOR": AttributeKind("FLOAT_VECTOR", "vector", 3), "FLOAT": AttributeKind("FLOAT", "value", 1),
         "QUATERNION": AttributeKind("QUATERNION", "value", 4),
         "FLOAT4": AttributeKind("FLOAT4", "vector", 4)}


def sh_attribute(k: int) -> str:
    return f"{SH_PREFIX}{k}"


def attribute_kind(name: str) -> AttributeKind:
    return KINDS["QUATERNION" if name == ROTATION else "FLOAT4" if name == BASE else
                 "FLOAT" if name in (TIME_CENTER, TIME_PRECISION, CENTRE_OPACITY) else "FLOAT_VECTOR"]


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


def motion_attributes(model: SplatArrays, motion: dict[str, np.ndarray], origin=(0.0, 0.0, 0.0)) -> dict[str, np.ndarray]:
    """The point attributes of a 4D model: `model` its parameters at each Gaussian's time centre (to_attributes'),
    `motion` its motion by DynamicGaussians' names (MOTION_FIELDS), and the opacity at the centre, which
    radiance:base's fourth value is scaled from at each time (opacity_at)."""
    attributes = to_attributes(model, origin)
    attributes.update({name: np.ascontiguousarray(motion[field], np.float32) for name, field in MOTION_FIELDS.items()})
    attributes[CENTRE_OPACITY] = attributes[BASE][:, 3].copy()
    return attributes


def native_attributes(model: SplatArrays, motion: dict[str, np.ndarray] | None, origin=(0.0, 0.0, 0.0)):
    """The attributes of a static model (`motion` None) or of a 4D one (core/splats.read_motion_ply_bytes)."""
    return to_attributes(model, origin) if motion is None else motion_attributes(model, motion, origin)


REFRESH_SECONDS = 1.0  # the least time from one refresh of a followed model to the next
# A refresh moves the whole model (248 bytes a Gaussian at SH degree 3): 1M Gaussians take 20 s over 100 Mbit/s.
# So while a remote backend trains, its model comes this seldom; once training pauses or ends, at once.
REMOTE_REFRESH_SECONDS = 30.0


def refresh_interval(remote: bool, state: str | None) -> float:
    """The least seconds between two refreshes of the native objects that follow a session's model, its backend
    remote or not, its training in `state`."""
    return REMOTE_REFRESH_SECONDS if remote and state == "training" else REFRESH_SECONDS


def fingerprint(positions: np.ndarray) -> str:
    """What tells the points of a native splat object apart from those written into it: their count and a hash of
    their positions (float32, in order). Deleting, moving or cropping points changes it; so does a modifier that
    moves or removes points. Hashing 1M points' positions takes about 25 ms (two CPU cores); they are a
    twentieth of the floats of a model of SH degree 3, which is read only once it differs."""
    values = np.ascontiguousarray(positions, np.float32)
    return f"{len(values)}:{hashlib.blake2b(values.data, digest_size=16).hexdigest()}"


def opacity_at(time: float, opacity, time_centers, time_precisions) -> np.ndarray:
    """Opacities at `time` of Gaussians of opacity `opacity` at their time centres: sigmoid of
    dynamic.scaled_logits(logit, -precision dt^2 / 2), which is opacity * exp(-precision dt^2 / 2) exactly."""
    dt = np.float32(time) - time_centers
    return (opacity * np.exp(np.float32(-0.5) * time_precisions * dt * dt)).astype(np.float32)


def motion_at(attributes: dict[str, np.ndarray], time: float) -> dict[str, np.ndarray]:
    """A 4D object's model attributes at `time` (motion_attributes'), in numpy: positions by velocity and
    acceleration, rotations turned by the rotation vector angular velocity * dt in world space (left-multiplied,
    as dynamic.reference_motion), opacities by the time window."""
    dt = (np.float32(time) - attributes[TIME_CENTER])[:, None]
    position = attributes[POSITION] + attributes[VELOCITY] * dt + np.float32(0.5) * attributes[ACCELERATION] * (dt * dt)
    rotvec = attributes[ANGULAR_VELOCITY] * dt
    angle = np.linalg.norm(rotvec, axis=1, keepdims=True)
    half = 0.5 * angle
    axis = np.divide(rotvec, angle, out=np.zeros_like(rotvec), where=angle > 0)
    turn = np.concatenate([np.cos(half), axis * np.sin(half)], axis=1)
    q = attributes[ROTATION]
    w = turn[:, :1] * q[:, :1] - (turn[:, 1:] * q[:, 1:]).sum(1, keepdims=True)
    v = turn[:, :1] * q[:, 1:] + q[:, :1] * turn[:, 1:] + np.cross(turn[:, 1:], q[:, 1:])
    base = attributes[BASE].copy()
    base[:, 3] = opacity_at(time, attributes[CENTRE_OPACITY], attributes[TIME_CENTER], attributes[TIME_PRECISION])
    return {**attributes, POSITION: position.astype(np.float32), ROTATION: np.concatenate([w, v], 1).astype(np.float32),
            BASE: base}


# A model kept in a file outside the .blend: a Geometry Nodes node of Blender's imports the file (scene/native.py's
# file modifier), by the file name's ending. Keep Outside .blend writes a 3DGS PLY.
FILE_IMPORT_NODES = {".ply": "GeometryNodeImportPLY", ".spz": "GeometryNodeImportSPZ"}
OUTSIDE_SUFFIX = ".ply"
UNSAFE_NAME = re.compile(r'[<>:"/\\|?*\x00-\x1f]')  # what a file name may not hold on some system


def file_import_node(path: str) -> str:
    """The Geometry Nodes node that imports splat file `path` (by its ending); SplatwrightError for a file that
    Blender's nodes cannot read."""
    name = path.lower()
    if name.endswith(".compressed.ply"):
        raise SplatwrightError(f"{path}: Blender's nodes import a 3DGS PLY or an SPZ, not a compressed PLY; export "
                               "it as .ply or .spz (Export Splats) and link that file")
    node = FILE_IMPORT_NODES.get(os.path.splitext(name)[1])
    if node is None:
        raise SplatwrightError(f"{path}: a linked file is a 3DGS PLY (.ply) or an SPZ (.spz); choose one of those")
    return node


def outside_file(chosen: str, object_name: str, blend_saved: bool) -> str:
    """The file Keep Outside .blend writes object `object_name`'s model to: `chosen` (absolute, or relative to the
    .blend's folder: `//name.ply`), or where none is chosen `//<object name>.ply` beside the .blend.
    SplatwrightError for a relative path while the .blend is unsaved, or a name that is not a .ply."""
    path = chosen or f"//{UNSAFE_NAME.sub('_', object_name)}{OUTSIDE_SUFFIX}"
    if path.startswith("//") and not blend_saved:
        raise SplatwrightError(f"{path} is beside the .blend, which is not saved yet: save the .blend first, or "
                               "choose an absolute path")
    if not path.lower().endswith(OUTSIDE_SUFFIX) or path.lower().endswith(".compressed.ply"):
        raise SplatwrightError(f"{path}: Keep Outside .blend writes a 3DGS PLY; name the file .ply")
    return path

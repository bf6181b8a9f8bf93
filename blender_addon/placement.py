"""Where a splat model sits in the scene (bpy-free): the object that places it, the camera the backend renders
the model through, and the depth of what it renders in the scene's units.

A model object's world matrix places the model's own space in the world, about the model's centre (the
object's origin is the point of the model that `centre` names), so the backend keeps rendering the model as it
was trained: the scene camera is taken into model space instead. That is exact for rotations, translations and
uniform scales: a uniform scale s about the camera leaves the image as it is and multiplies depths by s.
Non-uniform scales, shears and mirrors are refused."""
from __future__ import annotations

import numpy as np

from .core.cameras import Camera
from .core.errors import SplatwrightError
from .core.points import read_points

SCALE_TOLERANCE = 1e-4  # relative difference between the axes' scales that still counts as uniform
BOUNDS_PERCENTILES = (1.0, 99.0)  # a few stray Gaussians do not make the model's box


def model_to_world(object_matrix, centre) -> np.ndarray:
    """The model's placement: the object's world matrix with the model's `centre` at the object's origin."""
    to_origin = np.eye(4)
    to_origin[:3, 3] = -np.asarray(centre, dtype=np.float64)
    return np.asarray(object_matrix, dtype=np.float64) @ to_origin


def uniform_scale(matrix, what: str = "the model") -> float:
    """The scale of a 4x4 placement made of a rotation, a translation and one scale for all axes; raises
    SplatwrightError for anything else."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (4, 4) or not np.all(np.isfinite(m)) or not np.allclose(m[3], [0.0, 0.0, 0.0, 1.0]):
        raise SplatwrightError(f"{what} is not an affine 4x4 placement")
    linear = m[:3, :3]
    scales = np.linalg.norm(linear, axis=0)
    scale = float(scales.mean())
    if scale <= 0.0 or np.linalg.det(linear) <= 0.0:
        raise SplatwrightError(f"{what} has a zero or mirroring scale; give it a positive scale")
    rotation = linear / scale
    if (np.abs(scales - scale).max() > SCALE_TOLERANCE * scale
            or not np.allclose(rotation.T @ rotation, np.eye(3), atol=SCALE_TOLERANCE)):
        raise SplatwrightError(f"{what} is scaled unevenly ({', '.join(f'{s:.4g}' for s in scales)}) or "
                               "sheared; splat models take one scale for all axes, so give X, Y and Z the same "
                               "scale")
    return scale


def camera_in_model(camera: Camera, model_matrix, what: str = "the model") -> tuple[Camera, float]:
    """The camera that sees the model in its own space as `camera` sees it placed by `model_matrix`, and the
    factor that turns the model-space depths of its frames into the scene's."""
    m = np.asarray(model_matrix, dtype=np.float64)
    scale = uniform_scale(m, what)
    rotation, translation = m[:3, :3] / scale, m[:3, 3]
    c2w = np.eye(4)
    c2w[:3, :3] = rotation.T @ camera.c2w[:3, :3]
    c2w[:3, 3] = rotation.T @ (camera.c2w[:3, 3] - translation) / scale
    return Camera(c2w, camera.K, camera.width, camera.height), scale


def model_bounds(ply_path) -> tuple[np.ndarray, float]:
    """Centre and half the largest side of the box around a model's Gaussians (a 3DGS PLY), leaving out the
    few farthest along each axis."""
    xyz, _ = read_points(ply_path)
    if len(xyz) == 0:
        raise SplatwrightError("the model has no Gaussians")
    lo, hi = np.percentile(xyz.astype(np.float64), BOUNDS_PERCENTILES, axis=0)
    return 0.5 * (lo + hi), max(0.5 * float((hi - lo).max()), 1e-3)

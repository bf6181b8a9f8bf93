"""Where a splat model sits in the scene (bpy-free): the object that places it, the camera the backend renders
the model through, the depth of what it renders in the scene's units, and the box it is cropped to.

A model object's world matrix places the model's own space in the world, about the model's centre (the
object's origin is the point of the model that `centre` names), so the backend keeps rendering the model as it
was trained: the scene camera is taken into model space instead. That is exact for rotations, translations and
uniform scales: a uniform scale s about the camera leaves the image as it is and multiplies depths by s.
Non-uniform scales, shears and mirrors are refused."""
from __future__ import annotations

import numpy as np

from ..core import codecs
from ..core.cameras import Camera
from ..core.errors import SplatwrightError
from ..core.protocol import affine_placement, placement_scale

BOUNDS_PERCENTILES = (1.0, 99.0)  # a few stray Gaussians do not make the model's box


def model_to_world(object_matrix, centre) -> np.ndarray:
    """The model's placement: the object's world matrix with the model's `centre` at the object's origin."""
    to_origin = np.eye(4)
    to_origin[:3, 3] = -np.asarray(centre, dtype=np.float64)
    return np.asarray(object_matrix, dtype=np.float64) @ to_origin


def uniform_scale(matrix, what: str = "the model") -> float:
    """The scale of a 4x4 placement made of a rotation, a translation and one scale for all axes; raises
    SplatwrightError, naming `what`, for anything else."""
    try:
        return placement_scale(matrix, what)
    except ValueError as e:
        raise SplatwrightError(str(e)) from None


def any_affine(matrix, what: str = "the model") -> np.ndarray:
    """A 4x4 placement of any invertible affine map (a native splat object's world matrix, which may scale
    unevenly, shear and mirror: the backend places a static model by it); raises SplatwrightError, naming
    `what`, for one that flattens the model."""
    try:
        return affine_placement(matrix, what)
    except ValueError as e:
        raise SplatwrightError(str(e)) from None


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


def crop_matrix(box_matrix, box_size: float, model_matrix, what: str = "the crop box") -> np.ndarray:
    """Model space into the unit cube [-1, 1]^3 of a crop box, a cube-shaped Empty at `box_matrix` in the world
    whose display size `box_size` is half its side, for a model placed by `model_matrix`. The box may be scaled
    unevenly and turned any way; one of no size is refused, naming `what`."""
    box = np.asarray(box_matrix, dtype=np.float64) @ np.diag([box_size, box_size, box_size, 1.0])
    if not np.all(np.isfinite(box)) or abs(np.linalg.det(box[:3, :3])) < 1e-12:
        raise SplatwrightError(f"{what} has no size along some axis; give it a size and a scale other than 0")
    crop = np.linalg.inv(box) @ np.asarray(model_matrix, dtype=np.float64)
    crop[3] = [0.0, 0.0, 0.0, 1.0]  # affine, without the inverse's rounding
    return crop


def model_bounds(xyz: np.ndarray) -> tuple[np.ndarray, float]:
    """Centre and half the largest side of the box around a model's Gaussians (their means), leaving out the
    few farthest along each axis."""
    if len(xyz) == 0:
        raise SplatwrightError("the model has no Gaussians")
    lo, hi = np.percentile(xyz.astype(np.float64), BOUNDS_PERCENTILES, axis=0)
    return 0.5 * (lo + hi), max(0.5 * float((hi - lo).max()), 1e-3)


def scene_depths(depth: np.ndarray, depth_scale: float) -> np.ndarray:
    """A frame's depths (flat float32) in the scene's units, for depths of the model's space times
    `depth_scale` (camera_in_model's factor); the background's stay as Blender's Depth pass has them."""
    depth = depth.ravel()
    return np.where(depth < codecs.DEPTH_BACKGROUND, depth * depth_scale, codecs.DEPTH_BACKGROUND).astype(np.float32)

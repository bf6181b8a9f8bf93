"""Cameras: the one definition of the camera conventions (numpy only, no torch, no bpy).

Backend cameras are OpenCV-style: `c2w` maps camera to world with the camera's x right, y down and
z forward. World space is Blender's (Z up, metres). Intrinsics `K` are in pixels, in continuous image
coordinates whose origin is the top-left corner of the top-left pixel, so pixel (i, j) has its centre at
(i + 0.5, j + 0.5) and a centred principal point is (width / 2, height / 2).

Blender cameras (and NeRF-synthetic `transform_matrix`) look down their local -Z with +Y up; flipping
the local Y and Z axes turns one into the other.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import SplatwrightError

# Right-multiplying a Blender camera-to-world matrix by this gives the OpenCV one (and back).
BLENDER_TO_OPENCV = np.diag([1.0, -1.0, -1.0, 1.0])


@dataclass(frozen=True)
class Camera:
    c2w: np.ndarray  # (4, 4) float64, OpenCV camera-to-world, rigid
    K: np.ndarray  # (3, 3) float64 intrinsics in pixels
    width: int
    height: int

    @property
    def w2c(self) -> np.ndarray:
        return rigid_inverse(self.c2w)

    @property
    def position(self) -> np.ndarray:
        return self.c2w[:3, 3].copy()

    def world_to_pixel(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Project world points (N, 3) to continuous pixel coordinates (N, 2) and view depths (N,)."""
        w2c = self.w2c
        p = np.asarray(points, dtype=np.float64) @ w2c[:3, :3].T + w2c[:3, 3]
        z = p[:, 2]
        uv = (p[:, :2] / z[:, None]) * np.diag(self.K)[:2] + self.K[:2, 2]
        return uv, z

    def scaled(self, factor: float) -> "Camera":
        """The same camera for an image resized by `factor` (rounded to whole pixels)."""
        width, height = max(1, round(self.width * factor)), max(1, round(self.height * factor))
        sx, sy = width / self.width, height / self.height
        K = self.K.copy()
        K[0] *= sx
        K[1] *= sy
        return Camera(self.c2w, K, width, height)


def rigid_inverse(m: np.ndarray) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = m[:3, :3].T
    out[:3, 3] = -m[:3, :3].T @ m[:3, 3]
    return out


def check_rigid(m: np.ndarray, what: str, tol: float = 1e-4) -> np.ndarray:
    """Return `m` as a float64 4x4 rigid transform, or raise naming what is wrong with it."""
    m = np.asarray(m, dtype=np.float64)
    if m.shape == (3, 4):
        m = np.vstack([m, [0.0, 0.0, 0.0, 1.0]])
    if m.shape != (4, 4):
        raise SplatwrightError(f"{what}: expected a 4x4 matrix, got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise SplatwrightError(f"{what}: matrix contains NaN or infinity")
    if not np.allclose(m[3], [0.0, 0.0, 0.0, 1.0], atol=tol):
        raise SplatwrightError(f"{what}: last row is {m[3].tolist()}, expected [0, 0, 0, 1]")
    rot = m[:3, :3]
    det = np.linalg.det(rot)
    if abs(det) < 1e-8:
        raise SplatwrightError(f"{what}: matrix is singular (determinant {det:.3g})")
    if not np.allclose(rot.T @ rot, np.eye(3), atol=tol) or det < 0:
        raise SplatwrightError(
            f"{what}: rotation part is not a proper rotation (it scales, shears or mirrors); "
            "camera matrices must be rigid")
    return m


def from_blender_c2w(matrix: np.ndarray, K: np.ndarray, width: int, height: int,
                     what: str = "camera") -> Camera:
    """A camera from a Blender (or NeRF-synthetic) camera-to-world matrix."""
    c2w = check_rigid(matrix, what) @ BLENDER_TO_OPENCV
    return Camera(c2w, np.asarray(K, dtype=np.float64), int(width), int(height))


def intrinsics(fx: float, fy: float, cx: float, cy: float) -> np.ndarray:
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def intrinsics_from_fov_x(camera_angle_x: float, width: int, height: int) -> np.ndarray:
    """Square pixels, centred principal point, horizontal field of view in radians."""
    if not 0.0 < camera_angle_x < math.pi:
        raise SplatwrightError(f"camera_angle_x must be in (0, pi) radians, got {camera_angle_x}")
    f = 0.5 * width / math.tan(0.5 * camera_angle_x)
    return intrinsics(f, f, 0.5 * width, 0.5 * height)


def look_at(eye, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """OpenCV camera-to-world for a camera at `eye` looking at `target` (world Z up by default)."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    z = target - eye
    z /= np.linalg.norm(z)
    x = np.cross(z, up)
    if np.linalg.norm(x) < 1e-9:  # looking straight along `up`
        x = np.cross(z, [0.0, 1.0, 0.0])
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = x, y, z, eye
    return c2w

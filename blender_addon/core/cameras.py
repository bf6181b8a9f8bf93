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

    def cropped(self, x: int, y: int, width: int, height: int) -> "Camera":
        """The same camera for the `width` x `height` part of its image whose top-left pixel is (x, y)."""
        if not (0 <= x and 0 <= y and width >= 1 and height >= 1 and x + width <= self.width
                and y + height <= self.height):
            raise SplatwrightError(f"crop {width}x{height} at ({x}, {y}) does not fit a {self.width}x{self.height} image")
        K = self.K.copy()
        K[0, 2] -= x
        K[1, 2] -= y
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


# --- Blender cameras and viewports -----------------------------------------------------------------
#
# The rule Blender uses (BKE_camera_params_compute_viewplane), stated once for our intrinsics:
# - the image is width x height pixels, width = resolution_x * percentage // 100 (same for height);
# - pixel aspect (ax, ay) makes each pixel ay/ax times as tall as wide in view space, so fy = fx * ax / ay;
# - the sensor fit picks the axis the sensor size spans: HORIZONTAL spans the width, VERTICAL the height,
#   AUTO the larger of the pixel-aspect-corrected sizes (ax * width vs ay * height);
# - the sensor size is sensor_height for VERTICAL and sensor_width otherwise (AUTO included);
# - lens shift is in units of the fitted size, so the principal point moves by shift * fit size pixels
#   along x, and shift * fit size / (ay / ax) pixels along y (down in our images when shift_y is up).

SENSOR_FITS = ("AUTO", "HORIZONTAL", "VERTICAL")


@dataclass(frozen=True)
class BlenderLens:
    """The camera datablock fields that shape the projection (bpy.types.Camera)."""
    type: str  # 'PERSP', 'ORTHO' or 'PANO'
    lens: float  # focal length in mm
    sensor_width: float  # mm
    sensor_height: float  # mm
    sensor_fit: str  # one of SENSOR_FITS
    shift_x: float = 0.0
    shift_y: float = 0.0


@dataclass(frozen=True)
class RenderSize:
    """The render settings that set the image size (bpy.types.RenderSettings)."""
    resolution_x: int
    resolution_y: int
    percentage: int = 100
    pixel_aspect_x: float = 1.0
    pixel_aspect_y: float = 1.0

    @property
    def pixels(self) -> tuple[int, int]:
        """The rendered image size; Blender truncates the percentage scaling the same way."""
        return self.resolution_x * self.percentage // 100, self.resolution_y * self.percentage // 100


def blender_intrinsics(lens: BlenderLens, size: RenderSize) -> tuple[np.ndarray, int, int]:
    """K (in our pixel convention), width and height of what Blender renders through this camera."""
    if lens.type != "PERSP":
        kind = {"ORTHO": "orthographic", "PANO": "panoramic"}.get(lens.type, lens.type)
        raise SplatwrightError(f"{kind} cameras are not supported: Gaussian splatting needs a perspective "
                               "camera; set the camera's Type to Perspective")
    if lens.sensor_fit not in SENSOR_FITS:
        raise SplatwrightError(f"unknown sensor fit {lens.sensor_fit!r}; expected one of {', '.join(SENSOR_FITS)}")
    width, height = size.pixels
    if width < 1 or height < 1:
        raise SplatwrightError(f"render size {width}x{height} is empty; raise the resolution or its percentage")
    if lens.lens <= 0 or size.pixel_aspect_x <= 0 or size.pixel_aspect_y <= 0:
        raise SplatwrightError("focal length and pixel aspect must be positive")
    ycor = size.pixel_aspect_y / size.pixel_aspect_x
    fit = lens.sensor_fit
    if fit == "AUTO":
        fit = "HORIZONTAL" if size.pixel_aspect_x * width >= size.pixel_aspect_y * height else "VERTICAL"
    fit_size = width if fit == "HORIZONTAL" else ycor * height
    sensor = lens.sensor_height if lens.sensor_fit == "VERTICAL" else lens.sensor_width
    fx = lens.lens * fit_size / sensor
    cx = 0.5 * width - lens.shift_x * fit_size
    cy = 0.5 * height + lens.shift_y * fit_size / ycor
    return intrinsics(fx, fx / ycor, cx, cy), width, height


def blender_lens(K: np.ndarray, width: int, height: int, sensor_width: float = 36.0) -> tuple[BlenderLens, RenderSize]:
    """The Blender camera and render size that see through intrinsics `K` at `width` x `height`: what
    blender_intrinsics turns back into `K` (horizontal sensor fit, non-square pixels as pixel aspect)."""
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    ycor = fx / fy  # a pixel's height over its width
    aspect = (1.0, ycor) if ycor >= 1.0 else (1.0 / ycor, 1.0)  # Blender's pixel aspects are at least 1
    lens = BlenderLens("PERSP", fx * sensor_width / width, sensor_width, sensor_width * ycor * height / width,
                       "HORIZONTAL", (0.5 * width - cx) / width, (cy - 0.5 * height) * ycor / width)
    return lens, RenderSize(width, height, 100, *aspect)


def from_blender_camera(matrix_world: np.ndarray, lens: BlenderLens, size: RenderSize,
                        what: str = "camera") -> Camera:
    """The camera Blender renders through: a camera object's world matrix (its scale is ignored, as
    Blender does), its lens and the render size."""
    K, width, height = blender_intrinsics(lens, size)
    return from_blender_c2w(_without_scale(matrix_world), K, width, height, what)


def from_blender_view(view_matrix: np.ndarray, window_matrix: np.ndarray, width: int, height: int,
                      what: str = "viewport") -> Camera:
    """The camera of a 3D viewport region: RegionView3D.view_matrix (world to view), its window_matrix
    (OpenGL projection) and the region size in pixels."""
    P = np.asarray(window_matrix, dtype=np.float64)
    if P.shape != (4, 4) or abs(P[3, 3]) > 1e-9 or abs(P[3, 2] + 1.0) > 1e-6:
        raise SplatwrightError(f"{what}: not a perspective view (orthographic views are not supported); "
                               "switch the viewport to perspective (numpad 5)")
    # NDC x = P00 * x/-z - P02 spans the region's width from -1 to 1; NDC y points up, image rows down.
    K = intrinsics(0.5 * width * P[0, 0], 0.5 * height * P[1, 1],
                   0.5 * width * (1.0 - P[0, 2]), 0.5 * height * (1.0 + P[1, 2]))
    c2w = np.linalg.inv(np.asarray(view_matrix, dtype=np.float64))
    return from_blender_c2w(_without_scale(c2w), K, width, height, what)


def _without_scale(matrix: np.ndarray) -> np.ndarray:
    m = np.array(matrix, dtype=np.float64)
    if m.shape == (4, 4):
        norms = np.linalg.norm(m[:3, :3], axis=0)
        m[:3, :3] /= np.where(norms > 0, norms, 1.0)
    return m

"""A scene's views held in memory (Dataset), their times, and the region their cameras look at."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from .images import as_float


@dataclass
class Dataset:
    """A scene's views: cameras, images, names and, for a scene over time, the views' times.

    `images` stores each view compactly as its own uint8 (H, W, 3) tensor, at its camera's size (views of one
    scene may differ in size, as photos undistorted by COLMAP do): round(255 x) of each float image x in [0, 1]
    composited over the background (quantise), a quarter of float32's memory (300 views at 1920x1080 take
    1.9 GB, not 7.5), kept whole on the training device. Any sequence of views is taken (a stacked
    (N, H, W, 3) tensor too) and kept as a list. Read a view as float with image(i) (float32 (H, W, 3) in
    [0, 1], on the images' device); convert view by view, never all of them at once. The CUDA loss reads
    uint8 targets as they are (cuda/training.cu)."""
    cameras: list[Camera]
    images: list[torch.Tensor]  # per view, uint8 (H, W, 3), see above
    names: list[str]
    times: list[float] | None = None  # per view, in [0, 1] over the captured frames; None: a static scene

    def __post_init__(self):
        self.images = list(self.images)
        if len(self.images) != len(self.cameras):
            raise ValueError(f"Dataset: {len(self.images)} images for {len(self.cameras)} cameras")
        for i, (image, cam) in enumerate(zip(self.images, self.cameras)):
            if image.dtype != torch.uint8:
                raise TypeError(f"Dataset.images must be uint8 (each view through images.quantise), not "
                                f"{image.dtype}")
            if tuple(image.shape) != (cam.height, cam.width, 3):
                raise ValueError(f"Dataset: view {i}'s image is {tuple(image.shape)}, but its camera is "
                                 f"{cam.width}x{cam.height}; an image must be (height, width, 3) of its camera")

    def __len__(self) -> int:
        return len(self.cameras)

    def image(self, i: int) -> torch.Tensor:
        """View i as float32 (H, W, 3) in [0, 1], on the images' device."""
        return as_float(self.images[i])

    def time(self, i: int) -> float:
        """The time of view i (0 in a static scene)."""
        return self.times[i] if self.times is not None else 0.0

    def to(self, device) -> "Dataset":
        return Dataset(self.cameras, [image.to(device) for image in self.images], self.names, self.times)

    def mean_color(self) -> tuple[float, float, float]:
        """The views' mean colour, each channel over every pixel of every view, in [0, 1]."""
        total = sum(view.sum(dim=(0, 1), dtype=torch.int64).cpu() for view in self.images)  # exact, no float copy
        pixels = sum(view.shape[0] * view.shape[1] for view in self.images)
        return tuple(float(c) / (255.0 * pixels) for c in total)


def scene_times(times: list[float | None], what: str) -> list[float] | None:
    """The views' times: None when no view has one; every view needs one when some do."""
    missing = [i for i, t in enumerate(times) if t is None]
    if len(missing) == len(times):
        return None
    if missing:
        raise SplatwrightError(f"{what}: view {missing[0]} has no time but other views do; give every view a time "
                               "in [0, 1], or none")
    return times


def scene_bounds(cameras: list[Camera]) -> tuple[np.ndarray, float]:
    """Centre and half-size of the region to fill with initial Gaussians. Cameras around an object look at a
    common region: the point nearest to all optical axes, and half the width the nearest camera sees there.
    Cameras among the scene (a room seen from inside, looking outward) have no such region: a cube around
    the cameras, 1.5x their extent, so the walls they see are inside it."""
    centres = np.stack([c.position for c in cameras])
    axes = np.stack([c.c2w[:3, 2] for c in cameras])
    A = np.zeros((3, 3))
    b = np.zeros(3)
    for o, d in zip(centres, axes):
        P = np.eye(3) - np.outer(d, d)  # projects onto the plane normal to the axis
        A += P
        b += P @ o
    if np.linalg.cond(A) < 1e8:
        center = np.linalg.solve(A, b)
    else:  # parallel axes: fall back to a point in front of the mean camera
        center = centres.mean(0) + axes.mean(0)
    dist = np.linalg.norm(centres - center, axis=1)
    facing = ((center - centres) * axes).sum(1) > 0.5 * dist  # the centre within 60 degrees of the axis
    if facing.mean() < 0.5:
        return camera_spread(cameras)[0], 1.5 * camera_extent(cameras)
    nearest = int(np.argmin(dist))
    cam = cameras[nearest]
    half_width = 0.5 * dist[nearest] * cam.width / cam.K[0, 0]
    return center, float(max(half_width, 1e-3))


# The scene extent's rule, here alone: the camera centres farther from their median (per axis) than this many times
# their median distance from it are outliers (a camera registered far from the rest), left out of the extent.
OUTLIER_DISTANCE = 3.0


def camera_spread(cameras: list[Camera]) -> tuple[np.ndarray, float]:
    """The camera centres' mean and their largest distance from it, over the centres that are not outliers
    (OUTLIER_DISTANCE); where none is one, 3DGS's centre and radius."""
    centres = np.stack([c.position for c in cameras])
    distance = np.linalg.norm(centres - np.median(centres, axis=0), axis=1)
    kept = centres[distance <= OUTLIER_DISTANCE * np.median(distance)]
    mean = kept.mean(0)
    return mean, float(np.linalg.norm(kept - mean, axis=1).max())


def camera_extent(cameras: list[Camera]) -> float:
    """The scene extent that scales the position learning rates and densification's size thresholds: 3DGS's
    1.1 x the radius of the camera centres around their mean, without outlying cameras (camera_spread). The
    scene's points never enter it, so a few far points change nothing."""
    return float(1.1 * max(camera_spread(cameras)[1], 1e-3))

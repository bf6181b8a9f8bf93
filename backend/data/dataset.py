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

    `images` stores the views compactly as uint8 (N, H, W, 3): round(255 x) of each float image x in [0, 1]
    composited over the background (quantise), a quarter of float32's memory (300 views at 1920x1080 take
    1.9 GB, not 7.5), kept whole on the training device. Read a view as float with image(i) (float32
    (H, W, 3) in [0, 1], on the images' device); convert view by view, never all of them at once. The CUDA
    loss reads uint8 targets as they are (cuda/training.cu)."""
    cameras: list[Camera]
    images: torch.Tensor  # (N, H, W, 3) uint8, see above
    names: list[str]
    times: list[float] | None = None  # per view, in [0, 1] over the captured frames; None: a static scene

    def __post_init__(self):
        if self.images.dtype != torch.uint8:
            raise TypeError(f"Dataset.images must be uint8 (each view through images.quantise), not "
                            f"{self.images.dtype}")

    def __len__(self) -> int:
        return len(self.cameras)

    def image(self, i: int) -> torch.Tensor:
        """View i as float32 (H, W, 3) in [0, 1], on the images' device."""
        return as_float(self.images[i])

    def time(self, i: int) -> float:
        """The time of view i (0 in a static scene)."""
        return self.times[i] if self.times is not None else 0.0

    def to(self, device) -> "Dataset":
        return Dataset(self.cameras, self.images.to(device), self.names, self.times)

    def mean_color(self) -> tuple[float, float, float]:
        """The views' mean colour, each channel over every pixel of every view, in [0, 1]."""
        total = sum(view.float().mean(dim=(0, 1)) for view in self.images)  # one view at a time in float
        return tuple(float(c) for c in total / (255.0 * len(self)))


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
        return centres.mean(0), 1.5 * camera_extent(cameras)
    nearest = int(np.argmin(dist))
    cam = cameras[nearest]
    half_width = 0.5 * dist[nearest] * cam.width / cam.K[0, 0]
    return center, float(max(half_width, 1e-3))


def camera_extent(cameras: list[Camera]) -> float:
    """The 3DGS scene extent: 1.1 x the radius of the camera centres around their mean."""
    centres = np.stack([c.position for c in cameras])
    return float(1.1 * max(np.linalg.norm(centres - centres.mean(0), axis=1).max(), 1e-3))

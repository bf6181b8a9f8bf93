"""Capture geometry and the NeRF-synthetic dataset the add-on writes; numpy only, no bpy."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..core.cameras import BLENDER_TO_OPENCV, Camera, from_blender_c2w, intrinsics, look_at
from ..core.errors import SplatwrightError
from ..core.files import write_atomic

GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))


def orbit_poses(center, radius: float, count: int, seed: int, hemisphere: bool) -> list[np.ndarray]:
    """Blender camera-to-world matrices of `count` cameras looking at `center` from a sphere (or its upper
    half) of `radius`: a Fibonacci lattice, evenly spread, turned about Z by a seeded random angle."""
    center = np.asarray(center, dtype=np.float64)
    offset = np.random.default_rng(seed).uniform(0.0, 2.0 * math.pi)
    poses = []
    for i in range(count):
        t = (i + 0.5) / count
        z = 1.0 - t if hemisphere else 1.0 - 2.0 * t
        ring = math.sqrt(max(0.0, 1.0 - z * z))
        angle = offset + i * GOLDEN_ANGLE
        eye = center + radius * np.array([ring * math.cos(angle), ring * math.sin(angle), z])
        poses.append(look_at(eye, center) @ BLENDER_TO_OPENCV)
    return poses


def fitting_distance(bound_radius: float, K: np.ndarray, width: int, height: int, margin: float = 1.1) -> float:
    """How far a camera with these intrinsics must be from a sphere of `bound_radius` to see all of it."""
    half_fov = min(math.atan(0.5 * width / K[0, 0]), math.atan(0.5 * height / K[1, 1]))
    return margin * bound_radius / math.sin(half_fov)


def capture_percentage(resolution_x: int, resolution_y: int, percentage: int, max_side: int) -> int:
    """The resolution scale (1-100 %) a capture renders at: `percentage`, or less where that is needed to keep
    the longer side within `max_side` pixels (0: no limit)."""
    if max_side > 0:
        percentage = min(percentage, 100 * max_side // max(resolution_x, resolution_y, 1))
    return max(1, percentage)


def frame_time(frame: float, start: int, end: int) -> float:
    """A frame's time as a 4D model has it (the D-NeRF `time`): its place in the frame range, 0 at `start` to 1
    at `end`, clamped; 0 throughout a range of one frame."""
    return min(1.0, max(0.0, (frame - start) / (end - start))) if end > start else 0.0


def split_of(index: int, test_every: int) -> str:
    """Every `test_every`-th view is held out for testing (0: none)."""
    return "test" if test_every > 0 and index % test_every == test_every - 1 else "train"


def training_count(count: int, test_every: int) -> int:
    """How many of `count` views split_of leaves for training."""
    return count - (count // test_every if test_every > 0 else 0)


class DatasetWriter:
    """transforms_train.json / transforms_test.json (and any other split's) with per-frame intrinsics (as
    instant-ngp writes them), next to train/ and test/ folders of PNGs (or of images with another `extension`,
    such as ".jpg"), readable by `python -m backend train`."""

    def __init__(self, folder: str | Path, extension: str = ".png"):
        self.folder = Path(folder)
        self.extension = extension
        self.frames: dict[str, list[dict]] = {"train": [], "test": []}

    def image_path(self, split: str, name: str) -> Path:
        (self.folder / split).mkdir(parents=True, exist_ok=True)
        return self.folder / split / f"{name}{self.extension}"

    def add(self, split: str, name: str, cam: Camera, time: float | None = None) -> None:
        """A view; `time` (frame_time) in a dynamic scene, as D-NeRF datasets have it."""
        K = cam.K
        # A PNG's file path leaves out ".png", as NeRF-synthetic datasets do; other images' keep their extension.
        file_path = f"./{split}/{name}" + ("" if self.extension == ".png" else self.extension)
        self.frames.setdefault(split, []).append({
            "file_path": file_path,
            "transform_matrix": (cam.c2w @ BLENDER_TO_OPENCV).tolist(),
            "fl_x": K[0, 0], "fl_y": K[1, 1], "cx": K[0, 2], "cy": K[1, 2], "w": cam.width, "h": cam.height,
            "camera_angle_x": 2.0 * math.atan(0.5 * cam.width / K[0, 0]),
            **({} if time is None else {"time": time}),
        })

    def write(self) -> None:
        for split, frames in self.frames.items():
            if not frames:
                continue
            path = self.folder / f"transforms_{split}.json"
            meta = {"camera_angle_x": frames[0]["camera_angle_x"], "frames": frames}
            write_atomic(path, (json.dumps(meta, indent=1) + "\n").encode())


def training_views(folder: str | Path) -> list[tuple[str, Camera, Path, float | None]]:
    """(name, camera, image path, time or None) of each training view a DatasetWriter wrote into `folder`."""
    path = Path(folder) / "transforms_train.json"
    views = []
    try:
        for i, frame in enumerate(json.loads(path.read_text())["frames"]):
            K = intrinsics(frame["fl_x"], frame["fl_y"], frame["cx"], frame["cy"])
            cam = from_blender_c2w(np.array(frame["transform_matrix"]), K, frame["w"], frame["h"],
                                   f"{path} frame {i}")
            image = image_file(folder, frame["file_path"])
            views.append((image.stem, cam, image, frame.get("time")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SplatwrightError(f"{path}: not a readable capture ({e}); capture the views again") from None
    missing = [str(image) for _, _, image, _ in views if not image.is_file()]
    if missing:
        raise SplatwrightError(f"{missing[0]} is missing ({len(missing)} images in all); capture the views again")
    return views


def image_file(folder: str | Path, file_path: str) -> Path:
    """The image a DatasetWriter's file path names: the path itself where it ends in an image extension, else
    the path with ".png" (the NeRF-synthetic convention)."""
    path = Path(folder) / file_path
    return path if path.suffix.lower() in (".png", ".jpg", ".jpeg") else path.with_name(path.name + ".png")


def sample_surface(triangles: np.ndarray, colors: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` points spread over triangles (T, 3, 3) by area, each with its triangle's colour (T, 3) uint8."""
    a, b, c = triangles[:, 0], triangles[:, 1], triangles[:, 2]
    areas = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    if len(triangles) == 0 or areas.sum() <= 0:
        return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(triangles), size=count, p=areas / areas.sum())
    r1, r2 = np.sqrt(rng.random(count))[:, None], rng.random(count)[:, None]  # uniform over each triangle
    xyz = (1 - r1) * a[pick] + r1 * (1 - r2) * b[pick] + r1 * r2 * c[pick]
    return xyz.astype(np.float32), colors[pick]

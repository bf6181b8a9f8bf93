"""Datasets: a scene folder loaded into memory as tensors, whichever kind it is: NeRF-synthetic / instant-ngp
`transforms*.json` files (nerf.py) or a COLMAP capture (colmap.py); the views' images (images.py) in a
Dataset (dataset.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.points import POINTS_FILE, read_points
from . import colmap, nerf
from .dataset import Dataset
from .images import BACKGROUND

# NeRF-synthetic lego where the project's shared data sits beside the checkout: the demo's fallback scene and
# the benchmarks' and tests' scene.
LEGO = Path(__file__).resolve().parents[3] / "shared" / "data" / "lego"


def scene_point_cloud(root: str | Path) -> tuple[Path, np.ndarray, np.ndarray] | None:
    """The scene's own points, if it has any: its points3d.ply (a capture's surface points), else its COLMAP
    model's; (where they come from, positions (N, 3), uint8 colours (N, 3)), or None."""
    path, model = Path(root) / POINTS_FILE, colmap.find_model(root)
    if path.is_file():
        xyz, rgb = read_points(path)
    elif model is not None:
        path, (xyz, rgb) = model, colmap.read_points(root)
    else:
        return None
    return (path, xyz, rgb) if len(xyz) else None


def is_colmap(root: str | Path) -> bool:
    """Whether a scene folder is a COLMAP capture (photos): no transforms files, a COLMAP model (sparse/0)."""
    return Path(root).is_dir() and nerf.transforms_path(root, "train") is None and colmap.find_model(root) is not None


def prepare(root: str | Path) -> str | None:
    """Make what a scene folder needs before it loads (a distorted COLMAP model's undistorted copy,
    colmap.undistorted); a note saying what was made, or None."""
    return colmap.undistorted(root)[1] if is_colmap(root) else None


def load_split(root: str | Path, split: str, background=BACKGROUND, downscale: float = 1.0) -> Dataset | None:
    """Load one split, or None if the scene has no file for it (only 'train' is required). A COLMAP capture
    (is_colmap) loads through backend.data.colmap."""
    if is_colmap(root):
        return colmap.load_split(root, split, background, downscale)
    path = nerf.transforms_path(root, split)
    if path is None:
        if split == "train":
            raise SplatwrightError(f"{root}: no transforms_train.json or transforms.json; expected a NeRF-synthetic "
                                   "or instant-ngp scene folder, or a COLMAP one (images/ and sparse/0/)")
        return None
    return nerf.load_transforms(path, background, downscale)


def load_cameras(path: str | Path, downscale: float = 1.0) -> tuple[list[Camera], list[str]]:
    """Only the cameras of a transforms file (or of a COLMAP capture folder); image sizes come from its w/h or
    from the image headers."""
    path = Path(path)
    if path.is_dir() and colmap.find_model(path) is not None:
        return colmap.load_cameras(path, downscale)
    return nerf.load_cameras(path, downscale)

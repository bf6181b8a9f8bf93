"""COLMAP reconstructions as datasets: a capture folder with `images/` and a COLMAP model, read by
blender_addon/core/colmap.py (shared with the add-on, which imports the same models into Blender), whose
docstring states the conventions: poses and intrinsics carry over as they are, and every 8th image by name is
held out for testing. A model whose cameras have lens distortion (UNDISTORTABLE) is undistorted here, through
pycolmap, into the folder `undistorted/` beside its images, once: the loaders read that folder instead.
`python -m backend.data CAPTURE` does that alone (the add-on runs it where Blender's Python has no pycolmap).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from blender_addon.core.cameras import Camera
from blender_addon.core.colmap import (IMAGES_FOLDER, ColmapCamera, ColmapImage, Model, camera_of,
                                       distortion, find_model, image_path, make_undistorted, read_model,
                                       split_images, undistorted_copy)
from blender_addon.core.errors import SplatwrightError
from . import photos
from .dataset import Dataset
from .images import BACKGROUND, check_downscale, load_rgb, quantise, resized

# The reader's names are this module's too (the tests and the data loaders use them from here).
__all__ = ["ColmapCamera", "ColmapImage", "Model", "camera_of", "find_model", "read_model", "split_images",
           "load_split", "load_cameras", "read_points", "undistorted"]

def undistorted(root: str | Path) -> tuple[Path, str | None]:
    """The capture folder to read for `root`: `root` itself where its cameras are pinhole ones; else
    root/undistorted, made (pycolmap's undistortion) where it is missing or older than the model, with a note that
    says so (None where nothing was made)."""
    root = Path(root)
    distorted = distortion(root, read_model(find_model(root)))
    if not distorted:
        return root, None
    made = undistorted_copy(root)
    if made is not None:
        return made, None
    made = make_undistorted(photos.pycolmap_module(), root)
    return made, (f"{root}: the COLMAP model's {', '.join(distorted)} camera has lens distortion; its images were "
                  f"undistorted to pinhole cameras into {made}, which is what trains")


def load_split(root: str | Path, split: str, background=BACKGROUND, downscale: float = 1.0) -> Dataset | None:
    """The images of `split` with their cameras (None for an empty test split); a distorted model's from its
    undistorted copy (undistorted)."""
    root, _ = undistorted(root)
    model = read_model(find_model(root))
    chosen = split_images(model, split)
    if not chosen:
        if split == "train":
            raise SplatwrightError(f"{root}: the COLMAP model registers too few images to train on")
        return None
    cameras, images = [], []
    bg = np.asarray(background, dtype=np.float32)
    for image in chosen:
        path = image_path(root / IMAGES_FOLDER, image.name)
        if not path.is_file():
            raise SplatwrightError(f"{root}: image {image.name} of the COLMAP model is not in {root / IMAGES_FOLDER}")
        rgb = load_rgb(path, bg)
        cam = _fitted(camera_of(model, image, f"{root} image {image.name}"), rgb.shape[1], rgb.shape[0], downscale)
        if (cam.width, cam.height) != (rgb.shape[1], rgb.shape[0]):
            rgb = resized(rgb, cam.width, cam.height)
        cameras.append(cam)
        images.append(quantise(rgb))
    return Dataset(cameras, images, [Path(im.name).stem for im in chosen])


def load_cameras(root: str | Path, downscale: float = 1.0) -> tuple[list[Camera], list[str]]:
    """Every registered image's camera, at the size its camera declares (divided by `downscale`), and the image
    names without extension (as a transforms file names its frames); a distorted model's from its undistorted
    copy."""
    root, _ = undistorted(root)
    model = read_model(find_model(root))
    chosen = split_images(model, "all")
    cameras = [camera_of(model, im, f"{root} image {im.name}") for im in chosen]
    return [_fitted(c, c.width, c.height, downscale) for c in cameras], [Path(im.name).stem for im in chosen]


def read_points(root: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The model's 3D points: (xyz (P, 3) float32, rgb (P, 3) uint8)."""
    model = read_model(find_model(root))
    return model.xyz, model.rgb


def _fitted(cam: Camera, width: int, height: int, downscale: float) -> Camera:
    """`cam` for an image file of `width` x `height` (its intrinsics scaled from the declared size), then divided
    by `downscale`."""
    check_downscale(downscale)
    K = cam.K.copy()
    K[0] *= width / cam.width
    K[1] *= height / cam.height
    fitted = Camera(cam.c2w, K, width, height)
    return fitted.scaled(1.0 / downscale) if downscale != 1.0 else fitted

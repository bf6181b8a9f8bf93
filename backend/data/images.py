"""Images of a dataset's views: read from files, composited over a background, resized, and stored compactly."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.settings import default

BACKGROUND = tuple(default("background"))  # what a loader composites RGBA images over, unless told


def quantise(image) -> torch.Tensor:
    """The stored form of a float image in [0, 1] (a tensor or array, any shape): uint8 round(255 x), on the
    image's device. Converts one view at a time: the float temporaries are that view's size."""
    image = torch.from_numpy(np.ascontiguousarray(image)) if isinstance(image, np.ndarray) else image
    if image.dtype == torch.uint8:
        return image
    return image.clamp(0.0, 1.0).mul_(255.0).round_().to(torch.uint8)


def as_float(image: torch.Tensor) -> torch.Tensor:
    """A stored (uint8) image as float32 in [0, 1] (v / 255), on its device; a float image as it is."""
    return image.float() / 255.0 if image.dtype == torch.uint8 else image


def parse_background(text: str) -> tuple[float, float, float]:
    """'white', 'black' or 'r,g,b' with components in [0, 1]."""
    named = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}
    if text in named:
        return named[text]
    try:
        rgb = tuple(float(c) for c in text.split(","))
    except ValueError:
        rgb = ()
    if len(rgb) != 3 or not all(0.0 <= c <= 1.0 for c in rgb):
        raise SplatwrightError(f"background {text!r}: use 'white', 'black' or three numbers in [0, 1] like 0.5,0.5,0.5")
    return rgb


def over_background(image: np.ndarray, background) -> np.ndarray:
    """(H, W, 3) float32 RGB of a float (H, W, 3 or 4) image in [0, 1]; an alpha channel is composited over
    `background`, as training sees every view."""
    if image.shape[-1] == 4:
        return image[..., :3] * image[..., 3:] + np.asarray(background, dtype=np.float32) * (1.0 - image[..., 3:])
    return image


def load_rgb(path: Path, background) -> np.ndarray:
    """8-bit image as float RGB in [0, 1], over `background`."""
    try:
        with Image.open(path) as im:
            im = im.convert("RGBA") if im.mode in ("RGBA", "LA", "P") else im.convert("RGB")
            a = np.asarray(im, dtype=np.float32) / 255.0
    except (OSError, Image.DecompressionBombError) as e:
        raise SplatwrightError(f"{path}: cannot read image ({e})") from None
    return over_background(a, background)


def check_downscale(downscale: float) -> None:
    if not downscale >= 1.0:
        raise SplatwrightError(f"downscale must be a number >= 1, got {downscale}")


def resized(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """A float RGB image in [0, 1] box-filtered to `width` x `height`, through 8 bits."""
    return np.asarray(Image.fromarray((rgb * 255 + 0.5).astype(np.uint8)).resize(
        (width, height), Image.Resampling.BOX), dtype=np.float32) / 255.0

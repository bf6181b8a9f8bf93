"""Colour conversions between the backend's display-referred sRGB values and Blender's scene-linear buffers:
the one definition of the sRGB curve in the add-on (bpy-free). View transforms other than Standard take the
inverse view_transform.py makes."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def srgb_to_linear(x: np.ndarray) -> np.ndarray:
    """Display-referred sRGB values in [0, 1] to scene-linear ones (float32), what Blender's viewport and
    render results hold; its Standard view transform shows them as the display values again."""
    x = np.clip(np.asarray(x, dtype=np.float32), 0.0, 1.0)
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4).astype(np.float32)


def linear_to_srgb(x: np.ndarray) -> np.ndarray:
    """The inverse of srgb_to_linear (float64 in [0, 1])."""
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1 / 2.4) - 0.055)


def linear_to_srgb8(rgb: np.ndarray) -> np.ndarray:
    """Scene-linear colours to 8-bit sRGB, the display-referred values the renders hold."""
    return (linear_to_srgb(rgb) * 255.0 + 0.5).astype(np.uint8)


_LINEAR_OF_BYTE = srgb_to_linear(np.arange(256) / 255.0)


# A frame's conversion is shared out in pieces of at least this many values among a few threads: numpy lets go of
# the GIL while it multiplies, so a 1080p frame converts in a fraction of one core's time.
CONVERSION_PIECE = 1 << 20
CONVERSION_THREADS = min(4, os.cpu_count() or 1)
_converters = ThreadPoolExecutor(CONVERSION_THREADS, thread_name_prefix="splatwright-pixels")


def display_pixels(rgba: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """An (H, W, 4) uint8 frame as flat float32 in [0, 1], still sRGB-encoded: what an sRGB texture takes
    (one multiply per value; the GPU decodes to scene-linear when it samples); into `out` where given."""
    flat = rgba.reshape(-1)
    out = np.empty(flat.size, np.float32) if out is None else out
    pieces = max(1, min(CONVERSION_THREADS, flat.size // CONVERSION_PIECE))
    bounds = np.linspace(0, flat.size, pieces + 1, dtype=np.int64)

    def convert(k: int) -> None:
        a, b = bounds[k], bounds[k + 1]
        np.multiply(flat[a:b], np.float32(1.0 / 255.0), out=out[a:b], dtype=np.float32)
    if pieces == 1:
        convert(0)
    else:
        list(_converters.map(convert, range(pieces)))
    return out


def linear_pixels(rgba: np.ndarray) -> np.ndarray:
    """An (H, W, 4) uint8 frame as flat float32 scene-linear RGB with alpha in [0, 1] (render results)."""
    flat = rgba.reshape(-1)
    pixels = _LINEAR_OF_BYTE[flat]
    pixels[3::4] = flat[3::4] * np.float32(1.0 / 255.0)
    return pixels


def combined_pass(rgba: np.ndarray, background, transparent: bool, inverse=None) -> np.ndarray:
    """The Combined pass (H * W * 4,) float32 of a bottom-up RGBA8 frame: the scene-linear RGB that the
    scene's view transform shows as the frame's display values. `inverse` maps display values (N, 3) to
    those (view_transform.Inverse); None where the view transform is Standard, which shows the sRGB curve's
    values as they are. With a transparent film the background the frame was composited over is taken out
    again and RGB is premultiplied, as Blender's engines give it."""
    flat = rgba.reshape(-1, 4)
    if inverse is None and not transparent:
        pixels = linear_pixels(rgba).reshape(-1, 4)  # a table lookup per byte
        pixels[:, 3] = 1.0
        return pixels.reshape(-1)
    display = flat[:, :3] / np.float32(255.0)
    alpha = np.ones((len(flat), 1), np.float32)
    if transparent:
        alpha = flat[:, 3:] / np.float32(255.0)
        display = (display - np.asarray(background, np.float32) * (1.0 - alpha)) / np.maximum(alpha, 1e-6)
    pixels = np.empty(flat.shape, np.float32)
    pixels[:, :3] = (srgb_to_linear if inverse is None else inverse)(display) * alpha
    pixels[:, 3:] = alpha
    return pixels.reshape(-1)

"""Images in and out of the server: uploaded views decoded and checked, frames drawn from a model and encoded
for the wire (blender_addon/core/codecs.py)."""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from blender_addon.core import codecs
from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from .data import over_background
from .gaussians import Gaussians
from .render import render


def decode_upload(format: str, payload: bytes, width: int, height: int) -> np.ndarray:
    """An uploaded image as (H, W, 3 or 4) uint8 or float16, rows top-down, checked against the camera size.
    A PNG's size and completeness are checked from its header and data before anything the size of the image
    is made: a PNG cut short, or whose data ends early, is refused rather than padded with zeros."""
    if format == "png":
        try:
            png_width, png_height = codecs.png_header(payload)[:2]
            if (png_width, png_height) != (width, height):
                raise SplatwrightError(f"the PNG is {png_width}x{png_height} but its camera is {width}x{height}")
            codecs.check_png_complete(payload)
            with Image.open(io.BytesIO(payload), formats=["PNG"]) as im:
                has_alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
                mode = "RGBA" if has_alpha else "RGB"
                return np.asarray(im if im.mode == mode else im.convert(mode))
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise SplatwrightError(f"cannot decode the PNG ({e})") from None
    try:
        image = codecs.image_from_wire(format, payload, width, height)
    except ValueError as e:
        raise SplatwrightError(str(e)) from None
    if image.dtype != np.uint8 and not np.all(np.isfinite(image)):
        raise SplatwrightError("the float16 image contains NaN or infinity")
    return np.ascontiguousarray(image[::-1])


def view_rgb(image: np.ndarray, background) -> torch.Tensor:
    """(H, W, 3) float32 in [0, 1] of a stored view; an alpha channel is composited over `background`."""
    a = image.astype(np.float32)
    if image.dtype == np.uint8:
        a /= 255.0
    return torch.from_numpy(np.ascontiguousarray(over_background(np.clip(a, 0.0, 1.0), background)))


@dataclass
class QueuedFrame:
    """A frame whose planes are on their way to the host: RGBA8 (rows top-down), then, when asked for, the
    alpha-normalised view depth (float32, rows bottom-up as the wire carries it)."""
    planes: list[torch.Tensor]
    copied: torch.cuda.Event | None  # recorded after the copies on the GPU; None on the CPU


def queue_frame(g: Gaussians, camera: Camera, sh_degree: int, background, rasterizer: str, view,
                depth: bool) -> QueuedFrame:
    """Queue the frame's rendering and its copy to the host, without waiting for either: GPU stream order
    keeps later updates of the model after this frame's reads. `view`: render.camera_tensors of `camera`."""
    out = render(g, camera, sh_degree, background, rasterizer, view)
    rgba = (torch.cat([out.image, out.alpha[..., None]], dim=-1).clamp(0, 1) * 255 + 0.5).to(torch.uint8)
    planes = [rgba]
    if depth:
        z = torch.where(out.alpha > 0, out.depth / out.alpha.clamp_min(1e-12), codecs.DEPTH_BACKGROUND)
        planes.append(z.to(torch.float32).flip(0))
    copied = None
    if rgba.is_cuda:
        planes = [p.to("cpu", non_blocking=True) for p in planes]
        copied = torch.cuda.Event()
        copied.record()
    return QueuedFrame(planes, copied)


def encode_frame(frame: QueuedFrame, format: str) -> tuple[bytes | memoryview, int | None]:
    """The render reply's payload in `format` ("rgba8" rows bottom-up, or "png") and, with a depth plane,
    the offset where it follows the image."""
    if frame.copied is not None:
        frame.copied.synchronize()
    rgba = frame.planes[0].numpy()
    image = codecs.encode_png(rgba) if format == "png" else codecs.image_to_wire(rgba[::-1])[1]
    if len(frame.planes) == 1:
        return image, None
    return b"".join((image, np.ascontiguousarray(frame.planes[1].numpy(), dtype="<f4"))), len(image)

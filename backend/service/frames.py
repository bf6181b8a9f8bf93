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
from ..data.images import over_background
from ..gaussians import Gaussians
from ..render import render
from ..render.formation import STANDARD
from .shared_frames import SharedFrames, SharedSlot


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
    """A frame's bytes on their way to the host: the reply's payload as the device made it (frame_bytes), into
    `host` (pinned memory, or the shared slot itself where that is pinned; on the CPU the bytes themselves)."""
    host: torch.Tensor  # uint8
    format: str
    width: int
    height: int
    depth_offset: int | None  # where the depth plane follows the image, when there is one apart
    copied: torch.cuda.Event | None  # recorded after the copy on the GPU; None on the CPU
    slot: SharedSlot | None = None  # where the frame goes instead of the reply's payload


def frame_bytes(out, format: str, depth: bool) -> tuple[torch.Tensor, int | None]:
    """The frame's bytes as the reply carries them, made where it was rendered, and where its depth plane
    starts when one follows the image: flat uint8 of the raw formats' rows bottom-up (codecs), a "layer" packed
    as codecs.layer_pixels packs it; for "png" the RGBA rows top-down, which the host encodes, then the depth."""
    encoding = codecs.FRAME_ENCODINGS[format]
    rgba = (torch.cat([out.image, out.alpha[..., None]], dim=-1).clamp(0, 1) * 255 + 0.5).to(torch.uint8)
    if encoding.bottom_up:
        rgba = rgba.flip(0)
    if encoding.packs_depth:
        return packed_layer(rgba.contiguous(), depth_plane(out)), None
    if encoding.float_pixels:  # the bytes' values in float32, as colors.display_pixels makes them (tested equal)
        rgba = (rgba.to(torch.float32) * (1.0 / 255.0)).view(torch.uint8)
    if not depth:
        return rgba.reshape(-1), None
    return torch.cat([rgba.reshape(-1), depth_plane(out).reshape(-1).view(torch.uint8)]), rgba.numel()


def depth_plane(out) -> torch.Tensor:
    """The alpha-normalised view depth, rows bottom-up (codecs.DEPTH_BACKGROUND where nothing is drawn)."""
    z = torch.where(out.alpha > 0, out.depth / out.alpha.clamp_min(1e-12), codecs.DEPTH_BACKGROUND)
    return z.to(torch.float32).flip(0).contiguous()


def packed_layer(rgba: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """codecs.layer_pixels on the device, as flat bytes: the colour as the float of r + 256 g + 65536 b, and the
    depth's bits with alpha in the lowest 8 (both machines are little-endian, as the wire is)."""
    words = rgba.view(torch.int32)[..., 0]  # r | g << 8 | b << 16 | a << 24
    colour = (words & 0xFFFFFF).to(torch.float32)
    bits = (z.view(torch.int32) & -256) | ((words >> 24) & 255)
    return torch.stack([colour, bits.view(torch.float32)], dim=-1).reshape(-1).view(torch.uint8)


def queue_frame(g: Gaussians, camera: Camera, sh_degree: int, background, rasterizer: str, view, format: str,
                depth: bool, shared: SharedFrames | None = None, formation: str = STANDARD) -> QueuedFrame:
    """Queue the frame's rendering, its bytes and their copy to the host, on the current stream, without waiting
    for any of it. A raw frame goes into a slot of `shared` when one is free; an rgba32f frame finding none goes
    in the reply as rgba8, a quarter of the bytes (the frame's `format` says which). `view`:
    render.camera_tensors of `camera`; `formation`: the image formation it is drawn in."""
    out = render(g, camera, sh_degree, background, rasterizer, view, formation)
    data, depth_offset = frame_bytes(out, format, depth)
    slot = shared.take(data.numel()) if shared is not None and format in codecs.RAW_FRAME_FORMATS else None
    if slot is None and format == "rgba32f":
        format = "rgba8"
        data, depth_offset = frame_bytes(out, format, depth)
    copied = None
    host = data
    try:
        if data.is_cuda:
            # Pinned memory from torch's caching host allocator: reused once the copy that used it is done and the
            # reply's payload (a view of it) is sent.
            host = slot.bytes if slot is not None and slot.pinned else torch.empty(data.numel(), dtype=torch.uint8,
                                                                                  pin_memory=True)
            host.copy_(data, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
    except BaseException:
        if slot is not None:
            shared.discard(slot.index)
        raise
    return QueuedFrame(host, format, camera.width, camera.height, depth_offset, copied, slot)


def finish_frame(frame: QueuedFrame) -> tuple[dict, bytes | memoryview]:
    """Wait for the frame's copy; the render reply's fields for it (depth_offset, and the shared slot) and its
    payload."""
    if frame.copied is not None:
        frame.copied.synchronize()
    if frame.slot is not None:
        if frame.host is not frame.slot.bytes:
            frame.slot.bytes.copy_(frame.host)
        return {"depth_offset": frame.depth_offset, "shared_slot": frame.slot.index,
                "shared_bytes": frame.host.numel()}, b""
    data = frame.host.numpy()
    if frame.format != "png":
        return {"depth_offset": frame.depth_offset}, memoryview(data)
    image_end = frame.width * frame.height * 4
    image = codecs.encode_png(data[:image_end].reshape(frame.height, frame.width, 4))
    if frame.depth_offset is None:
        return {"depth_offset": None}, image
    return {"depth_offset": len(image)}, b"".join((image, data[image_end:]))

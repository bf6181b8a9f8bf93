"""Wire encodings of cameras, images and points, with their caps. Standard library + numpy only.

- Cameras: {"c2w": 4x4, "K": 3x3, "width": int, "height": int} as JSON numbers, the backend's OpenCV
  convention (cameras.py); the CAMERA kind encodes a Camera and decodes to one, checked to be usable.
- Raw images ("rgb8", "rgba8", "rgb16f", "rgba16f"): rows bottom-up (Blender's pixel buffers and GPU
  textures), pixels interleaved, values display-referred in [0, 1] (8-bit: 0..255), little-endian.
  "png" payloads are ordinary PNG files, rows top-down as PNG defines them.
- Layers ("layer" frames): colour and view depth packed in two float32 per pixel (layer_pixels), rows
  bottom-up, what the viewport's depth-composited views upload as they are.
- Display frames ("rgba32f"): RGBA as float32 in [0, 1], the sRGB-encoded values of the rgba8 frame (byte / 255,
  colors.display_pixels), rows bottom-up: what a live view's float texture takes as they are. Four times the bytes
  of rgba8, only for frames in shared memory on the backend's own machine: one finding no free slot (or asked
  for without shared memory) comes in the reply as rgba8, which the reply's format says.
- Points: xyz as float32 (N, 3) little-endian, then rgb as uint8 (N, 3).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from .cameras import Camera, check_rigid
from .errors import SplatwrightError
from .schema import Fields, Int, Kind, Numbers

MAX_IMAGE_SIDE = 8192
MAX_POINTS = 10_000_000

# Raw image formats: channels and numpy dtype. "png" is the one compressed format.
RAW_IMAGE_FORMATS = {"rgb8": (3, np.dtype("u1")), "rgba8": (4, np.dtype("u1")),
                     "rgb16f": (3, np.dtype("<f2")), "rgba16f": (4, np.dtype("<f2"))}
UPLOAD_FORMATS = ("png",) + tuple(RAW_IMAGE_FORMATS)
MAX_IMAGE_BYTES = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE * 4 * 2
DEPTH_BACKGROUND = 1e10  # depth of pixels the model does not cover, as Blender's Depth pass has it


@dataclass(frozen=True)
class FrameEncoding:
    """How a rendered frame of one format crosses the wire; the backend makes its bytes and the add-on reads
    them by this description alone."""
    bytes_per_pixel: int  # of the image as sent; 0: compressed (PNG, encoded on the host)
    float_pixels: bool  # float32 values as a texture takes them, uploaded as they arrive
    bottom_up: bool  # rows bottom-up, as Blender stores pixels (a PNG's run top-down)
    packs_depth: bool  # each pixel carries its depth (layer_pixels); else a depth plane may follow the image


FRAME_ENCODINGS = {
    "rgba8": FrameEncoding(bytes_per_pixel=4, float_pixels=False, bottom_up=True, packs_depth=False),
    "png": FrameEncoding(bytes_per_pixel=0, float_pixels=False, bottom_up=False, packs_depth=False),
    "layer": FrameEncoding(bytes_per_pixel=8, float_pixels=True, bottom_up=True, packs_depth=True),
    "rgba32f": FrameEncoding(bytes_per_pixel=16, float_pixels=True, bottom_up=True, packs_depth=False),
}
FRAME_FORMATS = tuple(FRAME_ENCODINGS)
RAW_FRAME_FORMATS = tuple(f for f, e in FRAME_ENCODINGS.items() if e.bytes_per_pixel)  # as the renderer makes them
MAX_RAW_FRAME_BYTES_PER_PIXEL = max(e.bytes_per_pixel for e in FRAME_ENCODINGS.values()) + 4  # and a depth plane


# ---- cameras ----

_CAMERA_FIELDS = Fields(c2w=Numbers((4, 4)), K=Numbers((3, 3)),
                        width=Int(1, MAX_IMAGE_SIDE), height=Int(1, MAX_IMAGE_SIDE))


def camera_to_wire(camera: Camera) -> dict:
    return {"c2w": np.asarray(camera.c2w, dtype=np.float64).reshape(4, 4).tolist(),
            "K": np.asarray(camera.K, dtype=np.float64).reshape(3, 3).tolist(),
            "width": int(camera.width), "height": int(camera.height)}


def camera_from_wire(value) -> Camera:
    """The Camera of a wire camera; ValueError unless it is one the renderer can use (positive focal
    lengths, a rigid camera-to-world)."""
    fields = _CAMERA_FIELDS.check(value)
    K = np.array(fields["K"], dtype=np.float64)
    if not (K[0, 0] > 0 and K[1, 1] > 0 and np.allclose(K[2], [0.0, 0.0, 1.0])):
        raise ValueError("camera K must be [[fx, s, cx], [0, fy, cy], [0, 0, 1]] with fx, fy > 0")
    try:
        c2w = check_rigid(np.array(fields["c2w"], dtype=np.float64), "camera c2w")
    except SplatwrightError as e:
        raise ValueError(str(e)) from None
    return Camera(c2w, K, fields["width"], fields["height"])


class CameraKind(Kind):
    def check(self, value) -> Camera:
        return camera_from_wire(value)

    def encode(self, value):
        return camera_to_wire(value) if isinstance(value, Camera) else value


CAMERA = CameraKind()


# ---- images ----

def image_to_wire(image: np.ndarray) -> tuple[str, memoryview]:
    """(format, payload) of an (H, W, 3 or 4) uint8 or float16 array whose rows are already bottom-up."""
    image = np.asarray(image)
    for name, (channels, dtype) in RAW_IMAGE_FORMATS.items():
        if image.ndim == 3 and image.shape[2] == channels and image.dtype == dtype:
            return name, memoryview(np.ascontiguousarray(image)).cast("B")
    raise ValueError(f"image must be (H, W, 3 or 4) uint8 or float16, got {image.shape} {image.dtype}")


def image_from_wire(format: str, payload: bytes, width: int, height: int) -> np.ndarray:
    """The (H, W, C) array of a raw image payload, rows bottom-up as sent."""
    channels, dtype = RAW_IMAGE_FORMATS[format]
    expected = width * height * channels * dtype.itemsize
    if len(payload) != expected:
        raise ValueError(f"{format} image of {width}x{height} needs {expected} payload bytes, got {len(payload)}")
    return np.frombuffer(payload, dtype=dtype).reshape(height, width, channels)


def layer_pixels(rgba: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """An (H, W, 4) uint8 frame and its (H, W) float32 depth plane in the two floats per pixel a float texture
    takes without conversion (flat float32): the colour as the integer r + 256 g + 65536 b, which a float holds
    exactly, and the depth with alpha in its lowest 8 mantissa bits (a relative error below 2^-15). Half the
    bytes of a float colour texture and a depth one, and uploaded as they are (render/overlay.py unpacks them). The
    "layer" frame format; the backend packs it on the GPU the same way (backend/service/frames.py, tested equal)."""
    words = np.ascontiguousarray(rgba, dtype=np.uint8).view("<u4").reshape(-1)  # r | g << 8 | b << 16 | a << 24
    out = np.empty((len(words), 2), dtype=np.float32)
    bits = out.view(np.uint32)
    np.bitwise_and(words, 0xFFFFFF, out=bits[:, 1])
    out[:, 0] = bits[:, 1]  # the integer as a float
    np.bitwise_and(np.ascontiguousarray(depth, dtype=np.float32).reshape(-1).view(np.uint32), 0xFFFFFF00,
                   out=bits[:, 1])
    bits[:, 1] |= words >> 24
    return out.reshape(-1)


def unpacked_layer(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of layer_pixels: (N, 4) uint8 colours and (N,) float32 depths."""
    pair = pixels.reshape(-1, 2)
    rgb, bits = pair[:, 0].astype(np.uint32), pair[:, 1].view(np.uint32)
    rgba = np.stack([rgb & 255, rgb >> 8 & 255, rgb >> 16, bits & 255], -1).astype(np.uint8)
    return rgba, (bits & np.uint32(0xFFFFFF00)).view(np.float32)


def float_pixels_from_wire(format: str, payload, width: int, height: int) -> np.ndarray:
    """The flat float32 pixels of a "layer" (layer_pixels) or "rgba32f" frame's bytes, without a copy."""
    expected = width * height * FRAME_ENCODINGS[format].bytes_per_pixel
    if len(payload) != expected:
        raise ValueError(f"{format} frame of {width}x{height} needs {expected} bytes, got {len(payload)}")
    return np.frombuffer(payload, dtype="<f4")


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def encode_png(rgba: np.ndarray, level: int = 1) -> bytes:
    """A PNG of an (H, W, 4) uint8 array with rows top-down; every row uses the 'Up' filter."""
    h, w, _ = rgba.shape
    rows = rgba.reshape(h, w * 4)
    up = np.empty((h, w * 4 + 1), dtype=np.uint8)
    up[:, 0] = 2
    up[0, 1:] = rows[0]
    up[1:, 1:] = rows[1:] - rows[:-1]  # uint8 arithmetic wraps modulo 256 as PNG requires

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)
    return (_PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(up.tobytes(), level))
            + chunk(b"IEND", b""))


_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # samples per pixel of each PNG colour type
# Adam7 interlacing: (first column, first row, column step, row step) of each of the seven passes.
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _png_chunks(data: bytes):
    """(kind, body) of each chunk up to IEND; ValueError for a file that is not a PNG or ends mid-chunk."""
    if bytes(data[:8]) != _PNG_SIGNATURE:
        raise ValueError("not a PNG (bad signature)")
    pos = len(_PNG_SIGNATURE)
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        if len(body) != size:
            raise ValueError("truncated PNG chunk")
        yield kind, body
        if kind == b"IEND":
            return
        pos += 12 + size


def png_header(data: bytes) -> tuple[int, int, int, int, int]:
    """(width, height, bit depth, colour type, interlace) from a PNG's IHDR, reading nothing else."""
    for kind, body in _png_chunks(data):
        if kind == b"IHDR" and len(body) == 13:
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            return w, h, depth, color, interlace
        break
    raise ValueError("the PNG does not start with an IHDR chunk")


def _png_data_size(w: int, h: int, depth: int, color: int, interlace: int) -> int:
    """Bytes the decompressed image data of a PNG with this header has: each row a filter byte and its
    samples, per interlace pass."""
    if color not in _PNG_SAMPLES or depth not in (1, 2, 4, 8, 16):
        raise ValueError(f"PNG colour type {color} with bit depth {depth} is not a valid PNG")
    bits = _PNG_SAMPLES[color] * depth
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    total = 0
    for x0, y0, dx, dy in passes:
        pw, ph = -(-(w - x0) // dx), -(-(h - y0) // dy)
        if pw > 0 and ph > 0:
            total += ph * (1 + -(-pw * bits // 8))
    return total


def check_png_complete(data: bytes, piece: int = 1 << 20) -> None:
    """ValueError unless the PNG's image data decompresses to exactly the size its header declares: a file
    cut short, or one whose data stops early (decoders fill the missing rows with zeros), is refused. Memory
    stays at `piece` bytes whatever the image size."""
    header = png_header(data)
    expected = _png_data_size(*header)
    inflater = zlib.decompressobj()
    got = 0
    try:
        for kind, body in _png_chunks(data):
            if kind != b"IDAT":
                continue
            pending = body
            while pending and got <= expected:
                got += len(inflater.decompress(pending, piece))
                pending = inflater.unconsumed_tail
    except zlib.error as e:
        raise ValueError(f"the PNG's image data is corrupt ({e})") from None
    if got < expected or not inflater.eof:
        raise ValueError(f"the PNG is truncated: its image data holds {got} of the {expected} bytes a "
                         f"{header[0]}x{header[1]} image needs")
    if got > expected:
        raise ValueError(f"the PNG's image data is longer than a {header[0]}x{header[1]} image needs")


def decode_png(data: bytes, max_pixels: int = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE) -> np.ndarray:
    """(H, W, 4) uint8, rows top-down, of an 8-bit RGBA non-interlaced PNG using filters None, Sub or Up
    (what encode_png writes). Other PNGs raise ValueError; the backend reads uploads with Pillow."""
    w, h, depth, color, interlace = png_header(data)
    if (depth, color, interlace) != (8, 6, 0):
        raise ValueError("only 8-bit RGBA non-interlaced PNGs are supported here")
    if not (0 < w and 0 < h and w * h <= max_pixels):
        raise ValueError(f"PNG size {w}x{h} is empty or over the cap of {max_pixels} pixels")
    idat = b"".join(body for kind, body in _png_chunks(data) if kind == b"IDAT")
    stride = w * 4 + 1
    inflater = zlib.decompressobj()
    raw = inflater.decompress(idat, h * stride + 1)  # bounded: a zip bomb cannot grow past this
    if len(raw) != h * stride:
        raise ValueError(f"PNG image data is {len(raw)} bytes, expected {h * stride}")
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(h, stride)
    out = np.empty((h, w * 4), dtype=np.uint8)
    previous = np.zeros(w * 4, dtype=np.uint8)
    for y in range(h):
        kind, line = rows[y, 0], rows[y, 1:]
        if kind == 0:
            out[y] = line
        elif kind == 1:
            out[y] = np.cumsum(line.reshape(w, 4), axis=0, dtype=np.uint8).reshape(-1)
        elif kind == 2:
            out[y] = line + previous
        else:
            raise ValueError(f"PNG filter type {kind} is not supported here (only None, Sub, Up)")
        previous = out[y]
    return out.reshape(h, w, 4)


# ---- points ----

def points_to_wire(xyz: np.ndarray, rgb: np.ndarray) -> bytes:
    """Payload of N points: float32 xyz (N, 3) then uint8 rgb (N, 3)."""
    xyz = np.ascontiguousarray(xyz, dtype="<f4")
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if xyz.ndim != 2 or xyz.shape[1] != 3 or rgb.shape != xyz.shape:
        raise ValueError(f"points need xyz (N, 3) and rgb (N, 3), got {xyz.shape} and {rgb.shape}")
    return xyz.tobytes() + rgb.tobytes()


def points_from_wire(payload: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    if len(payload) != count * 15:
        raise ValueError(f"{count} points need {count * 15} payload bytes (12 xyz + 3 rgb each), "
                         f"got {len(payload)}")
    xyz = np.frombuffer(payload, dtype="<f4", count=count * 3).reshape(count, 3)
    if not np.all(np.isfinite(xyz)):
        raise ValueError("point positions contain NaN or infinity")
    rgb = np.frombuffer(payload, dtype=np.uint8, offset=count * 12).reshape(count, 3)
    return xyz, rgb

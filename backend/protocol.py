"""The Splatwright wire protocol: framing, the message definitions both sides validate against, and the wire
encodings of cameras, images and points.

Standard library + numpy only: this file is copied verbatim into the Blender add-on, which has no torch.

A frame is

    MAGIC (4 bytes) | header length (uint32, big-endian) | header (UTF-8 JSON) | payload (raw bytes)

where the header is {"type": str, "id": int, "payload_size": int, "fields": {...}}. Requests carry an id
(>= 1) chosen by the client; the server answers each with a "reply" or an "error" of the same id. Events and
errors that answer no request carry id 0. Every size and field is capped; nothing but JSON and raw numbers
ever crosses the wire.

Wire conventions (one definition each):
- Cameras: {"c2w": 4x4, "K": 3x3, "width": int, "height": int} as JSON numbers, in the backend's OpenCV
  convention (camera-to-world, x right, y down, z forward; K in pixels).
- Raw images ("rgb8", "rgba8", "rgb16f", "rgba16f"): rows bottom-up (Blender's pixel buffers and GPU
  textures), pixels interleaved, values display-referred in [0, 1] (8-bit: 0..255), little-endian.
  "png" payloads are ordinary PNG files, rows top-down as PNG defines them.
- Points: xyz as float32 (N, 3) little-endian, then rgb as uint8 (N, 3).

Replies (fields; "status" = session, state, views, step, iterations, gaussians, checkpoint):
- hello, status, open_session, pause, resume, stop, load_checkpoint, shutdown: status
  (hello adds protocol and server; start_training adds continued: whether it went on from earlier steps)
- capabilities: python, torch, numpy, protocol, device, rasterizer, cuda_available, gpu, gpu_memory_gb,
  cuda_rasterizer, cuda_rasterizer_detail
- add_view: index, views; set_points: points; save_checkpoint: step, path; load_ply: gaussians, sh_degree
- render: width, height, format, step, sh_degree, background (what the frame is composited over) + the frame
  as payload (RGBA8 or PNG); with depth: true also depth_offset, where a float32 plane of the alpha-normalised
  view depth (rows bottom-up, DEPTH_BACKGROUND where nothing is drawn) follows the frame in the payload
- export_ply: path (where the session keeps its trained model; empty for a viewed PLY), gaussians, step + the
  PLY file as payload
Events ({"event": kind, ...}): "progress" (state, step, iterations, loss, psnr, gaussians, views, its_per_s,
gpu_memory_mb; loss and psnr null until measured), "state" (status), "error" (code, message).
"""
from __future__ import annotations

import ipaddress
import json
import re
import socket
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

PROTOCOL_VERSION = 1
MAGIC = b"SPW\x00"
PREFIX = struct.Struct(">4sI")  # magic, header length

MAX_HEADER_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 1 << 30
MAX_ID = 2**53  # JSON numbers stay exact below this
MAX_IMAGE_SIDE = 8192
MAX_POINTS = 10_000_000
MAX_TOKEN_CHARS = 4096
MAX_TEXT_CHARS = 4096
SESSION_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"

# Raw image formats: channels and numpy dtype. "png" is the one compressed format.
RAW_IMAGE_FORMATS = {"rgb8": (3, np.dtype("u1")), "rgba8": (4, np.dtype("u1")),
                     "rgb16f": (3, np.dtype("<f2")), "rgba16f": (4, np.dtype("<f2"))}
UPLOAD_FORMATS = ("png",) + tuple(RAW_IMAGE_FORMATS)
FRAME_FORMATS = ("rgba8", "png")
MAX_IMAGE_BYTES = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE * 4 * 2
DEPTH_BACKGROUND = 1e10  # depth of pixels the model does not cover, as Blender's Depth pass has it

# Error codes of "error" messages and "error" events.
BAD_FRAME = "bad_frame"  # the byte stream is not a frame; the connection is closed
TOO_LARGE = "too_large"  # a size is over its cap; the connection is closed
BAD_REQUEST = "bad_request"  # unknown type or invalid fields; the connection stays open
AUTH = "auth"  # missing hello or wrong token
VERSION = "version"  # protocol versions differ
BUSY = "busy"  # another client is connected
REJECTED = "rejected"  # a valid request that cannot be done now or with these values
SUPERSEDED = "superseded"  # a newer render request replaced this one before it started
OUT_OF_MEMORY = "out_of_memory"
DIVERGED = "diverged"  # the training loss became NaN or infinite
INTERNAL = "internal"  # a bug; the server log has the traceback


class ProtocolError(Exception):
    """A message that breaks the protocol. `fatal`: the stream is out of step and must be closed.
    `request_id`: the id of the offending request when it could be read, else 0."""

    def __init__(self, code: str, message: str, fatal: bool = False, request_id: int = 0):
        super().__init__(message)
        self.code, self.message, self.fatal, self.request_id = code, message, fatal, request_id


class ConnectionClosed(Exception):
    """The peer closed the connection cleanly between frames."""


# ---- field kinds: each checks one JSON value and returns it normalised, or raises ValueError ----

class Int:
    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {_kind(value)}")
        if not self.lo <= value <= self.hi:
            raise ValueError(f"{value} is outside [{self.lo}, {self.hi}]")
        return value


class Float:
    def __init__(self, lo: float, hi: float):
        self.lo, self.hi = lo, hi

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {_kind(value)}")
        if not self.lo <= value <= self.hi:  # also rejects NaN
            raise ValueError(f"{value} is outside [{self.lo}, {self.hi}]")
        return float(value)


class Bool:
    def check(self, value):
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_kind(value)}")
        return value


class Str:
    def __init__(self, max_chars: int = MAX_TEXT_CHARS, choices: tuple[str, ...] = (), pattern: str = ""):
        self.max_chars, self.choices = max_chars, choices
        self.pattern = re.compile(pattern) if pattern else None

    def check(self, value):
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {_kind(value)}")
        if len(value) > self.max_chars:
            raise ValueError(f"string of {len(value)} characters, more than {self.max_chars}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{value[:40]!r} is not one of {', '.join(self.choices)}")
        if self.pattern and not self.pattern.fullmatch(value):
            raise ValueError(f"{value[:40]!r} does not match {self.pattern.pattern}")
        return value


class Numbers:
    """A fixed-shape nested list of finite numbers in [lo, hi], e.g. a 4x4 matrix or an RGB triple."""

    def __init__(self, shape: tuple[int, ...], lo: float = -1e12, hi: float = 1e12):
        self.shape, self.lo, self.hi = shape, lo, hi

    def check(self, value):
        def walk(v, depth):
            if depth == len(self.shape):
                return Float(self.lo, self.hi).check(v)
            if not isinstance(v, list) or len(v) != self.shape[depth]:
                raise ValueError(f"expected a list of shape {list(self.shape)}")
            return [walk(x, depth + 1) for x in v]
        return walk(value, 0)


class Fields:
    """A JSON object with named, typed fields; unknown names are rejected."""

    def __init__(self, **fields: "Field | object"):
        self.fields = {name: f if isinstance(f, Field) else Field(f) for name, f in fields.items()}

    def check(self, value):
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {_kind(value)}")
        unknown = sorted(set(value) - set(self.fields))
        if unknown:
            raise ValueError(f"unknown field {unknown[0][:40]!r}; known: {', '.join(self.fields) or 'none'}")
        out = {}
        for name, f in self.fields.items():
            if name in value:
                try:
                    out[name] = f.kind.check(value[name])
                except ValueError as e:
                    raise ValueError(f"{name}: {e}") from None
            elif f.required:
                raise ValueError(f"missing field {name!r}")
            else:
                out[name] = f.default
        return out


class AnyObject:
    """A JSON object whose contents the receiver interprets (replies and events); the header cap bounds it."""

    def check(self, value):
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {_kind(value)}")
        return value


_REQUIRED = object()


@dataclass(frozen=True)
class Field:
    kind: object
    default: object = _REQUIRED

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def optional(kind, default=None) -> Field:
    return Field(kind, default)


@dataclass(frozen=True)
class MessageSpec:
    fields: Fields | AnyObject = field(default_factory=Fields)
    max_payload: int = 0


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


# ---- the messages ----

CAMERA = Fields(c2w=Numbers((4, 4)), K=Numbers((3, 3)),
                width=Int(1, MAX_IMAGE_SIDE), height=Int(1, MAX_IMAGE_SIDE))
BACKGROUND = Numbers((3,), 0.0, 1.0)

REQUESTS: dict[str, MessageSpec] = {
    "hello": MessageSpec(Fields(token=Str(MAX_TOKEN_CHARS), protocol=Int(0, 2**31),
                                client=optional(Str(200), ""))),
    "capabilities": MessageSpec(),
    "status": MessageSpec(),
    "open_session": MessageSpec(Fields(name=Str(64, pattern=SESSION_NAME), create=optional(Bool(), True))),
    "add_view": MessageSpec(Fields(camera=CAMERA, format=Str(choices=UPLOAD_FORMATS),
                                   name=optional(Str(200), "")), MAX_IMAGE_BYTES),
    "set_points": MessageSpec(Fields(count=Int(1, MAX_POINTS)), MAX_POINTS * 15),
    "start_training": MessageSpec(Fields(
        preset=optional(Str(choices=("quality", "fast")), "quality"),  # GPU schedules; CPU uses a short one
        iterations=optional(Int(1, 10_000_000)),  # default: the preset's
        sh_degree=optional(Int(0, 3), 3),
        max_gaussians=optional(Int(0, 100_000_000)),  # 0: no cap; default: the preset's
        init_points=optional(Int(1, 10_000_000)),  # random initial Gaussians when no points were set
        background=optional(BACKGROUND, [1.0, 1.0, 1.0]),
        checkpoint_every=optional(Int(0, 10_000_000), 500),  # steps; 0: only at stop and finish
        progress_interval=optional(Float(0.05, 3600.0), 0.5),  # seconds between progress events
        fresh=optional(Bool(), False))),  # ignore the session's checkpoint and start over
    "pause": MessageSpec(),
    "resume": MessageSpec(),
    "stop": MessageSpec(),
    "render": MessageSpec(Fields(camera=CAMERA, format=optional(Str(choices=FRAME_FORMATS), "rgba8"),
                                 depth=optional(Bool(), False))),
    "export_ply": MessageSpec(),
    "save_checkpoint": MessageSpec(),
    "load_checkpoint": MessageSpec(),
    "load_ply": MessageSpec(Fields(background=optional(BACKGROUND, [1.0, 1.0, 1.0])), MAX_PAYLOAD_BYTES),
    "shutdown": MessageSpec(),
}

# Reply and event fields depend on the request or the event; the receiver reads what it needs.
SERVER_MESSAGES: dict[str, MessageSpec] = {
    "reply": MessageSpec(AnyObject(), MAX_PAYLOAD_BYTES),
    "error": MessageSpec(Fields(code=Str(40), message=Str(MAX_TEXT_CHARS))),
    "event": MessageSpec(AnyObject()),
}


@dataclass
class Message:
    type: str
    id: int
    fields: dict
    payload: bytes = b""


# ---- framing ----

def encode_message(specs: dict[str, MessageSpec], type: str, id: int, fields: dict | None = None,
                   payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    """The frame's parts (prefix + header, payload), checked against `specs` as the receiver will."""
    fields = {} if fields is None else fields
    spec = specs.get(type)
    if spec is None:
        raise ValueError(f"unknown message type {type!r}")
    spec.fields.check(fields)
    if len(payload) > spec.max_payload:
        raise ValueError(f"{type}: payload of {len(payload)} bytes exceeds its cap of {spec.max_payload}")
    return [encode_header(type, id, fields, len(payload)), payload]


def encode_header(type: str, id: int, fields: dict, payload_size: int) -> bytes:
    """Prefix + JSON header with no checks of the fields (the fuzz tests use it to build bad frames)."""
    header = json.dumps({"type": type, "id": id, "payload_size": payload_size, "fields": fields},
                        separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"{type}: header of {len(header)} bytes exceeds the cap of {MAX_HEADER_BYTES}")
    return PREFIX.pack(MAGIC, len(header)) + header


def send_message(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    for part in parts:
        if len(part):
            sock.sendall(part)


def recv_exact(sock: socket.socket, n: int, at_boundary: bool = False) -> bytearray:
    """Exactly `n` bytes. A peer that closes before the first byte at a frame boundary raises
    ConnectionClosed; one that closes anywhere else left a frame unfinished."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            if at_boundary and got == 0:
                raise ConnectionClosed("peer closed the connection")
            raise ProtocolError(BAD_FRAME, f"connection closed mid-frame ({got} of {n} bytes received)",
                                fatal=True)
        got += k
    return buf


def read_message(sock: socket.socket, specs: dict[str, MessageSpec]) -> Message:
    """Read and validate one frame. Raises ConnectionClosed at a clean end of stream and ProtocolError
    for a bad frame (fatal when the stream can no longer be followed)."""
    magic, header_size = PREFIX.unpack(recv_exact(sock, PREFIX.size, at_boundary=True))
    if magic != MAGIC:
        raise ProtocolError(BAD_FRAME, f"frame does not start with {MAGIC!r} (got {bytes(magic)!r}); "
                            "is the peer a Splatwright client or server of this protocol?", fatal=True)
    if header_size > MAX_HEADER_BYTES:
        raise ProtocolError(TOO_LARGE, f"header of {header_size} bytes exceeds the cap of {MAX_HEADER_BYTES}",
                            fatal=True)
    type, request_id, payload_size, fields = parse_header(recv_exact(sock, header_size))
    spec = specs.get(type)
    max_payload = spec.max_payload if spec else 0
    if payload_size > max_payload:
        raise ProtocolError(TOO_LARGE, f"{type[:40]!r}: payload of {payload_size} bytes exceeds its cap of "
                            f"{max_payload}", fatal=True, request_id=request_id)
    payload = bytes(recv_exact(sock, payload_size)) if payload_size else b""
    if spec is None:
        raise ProtocolError(BAD_REQUEST, f"unknown message type {type[:40]!r}; known: {', '.join(specs)}",
                            request_id=request_id)
    try:
        fields = spec.fields.check(fields)
    except ValueError as e:
        raise ProtocolError(BAD_REQUEST, f"{type}: {e}", request_id=request_id) from None
    return Message(type, request_id, fields, payload)


def parse_header(data: bytes | bytearray) -> tuple[str, int, int, object]:
    """(type, id, payload size, raw fields) of a header; any fault here is fatal because the payload size
    cannot be trusted."""
    try:
        header = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, absurd nesting or integer sizes
        raise ProtocolError(BAD_FRAME, f"header is not valid UTF-8 JSON ({str(e)[:200]})", fatal=True) from None
    if not isinstance(header, dict) or set(header) != {"type", "id", "payload_size", "fields"}:
        raise ProtocolError(BAD_FRAME, "header must be an object with exactly type, id, payload_size, fields",
                            fatal=True)
    type, request_id, payload_size = header["type"], header["id"], header["payload_size"]
    try:
        Str(64).check(type)
        Int(0, MAX_ID).check(request_id)
        Int(0, MAX_PAYLOAD_BYTES).check(payload_size)
    except ValueError as e:
        raise ProtocolError(BAD_FRAME, f"bad header: {e}", fatal=True) from None
    return type, request_id, payload_size, header["fields"]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: treat as reachable from elsewhere
        return False


# ---- cameras ----

def camera_to_wire(c2w, K, width: int, height: int) -> dict:
    return {"c2w": np.asarray(c2w, dtype=np.float64).reshape(4, 4).tolist(),
            "K": np.asarray(K, dtype=np.float64).reshape(3, 3).tolist(),
            "width": int(width), "height": int(height)}


def camera_from_wire(camera: dict) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(c2w, K, width, height) of a validated camera field; K must have positive focal lengths."""
    K = np.array(camera["K"], dtype=np.float64)
    if not (K[0, 0] > 0 and K[1, 1] > 0 and np.allclose(K[2], [0.0, 0.0, 1.0])):
        raise ValueError("camera K must be [[fx, s, cx], [0, fy, cy], [0, 0, 1]] with fx, fy > 0")
    return np.array(camera["c2w"], dtype=np.float64), K, camera["width"], camera["height"]


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


def decode_png(data: bytes, max_pixels: int = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE) -> np.ndarray:
    """(H, W, 4) uint8, rows top-down, of an 8-bit RGBA non-interlaced PNG using filters None, Sub or Up
    (what encode_png writes). Other PNGs raise ValueError; the backend reads uploads with Pillow."""
    if not data.startswith(_PNG_SIGNATURE):
        raise ValueError("not a PNG (bad signature)")
    pos, ihdr, idat = len(_PNG_SIGNATURE), None, []
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        if len(body) != size:
            raise ValueError("truncated PNG chunk")
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + size
    if ihdr is None:
        raise ValueError("PNG has no IHDR chunk")
    w, h, depth, color, _, _, interlace = ihdr
    if (depth, color, interlace) != (8, 6, 0):
        raise ValueError("only 8-bit RGBA non-interlaced PNGs are supported here")
    if not (0 < w and 0 < h and w * h <= max_pixels):
        raise ValueError(f"PNG size {w}x{h} is empty or over the cap of {max_pixels} pixels")
    stride = w * 4 + 1
    inflater = zlib.decompressobj()
    raw = inflater.decompress(b"".join(idat), h * stride + 1)  # bounded: a zip bomb cannot grow past this
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

"""The Splatwright wire protocol: the messages both sides validate against (requests, their replies and the
server's events, each declared once below) and the framing. Standard library + numpy only.

A frame is

    MAGIC (4 bytes) | header length (uint32, big-endian) | header (UTF-8 JSON) | payload (raw bytes)

where the header is {"type": str, "id": int, "payload_size": int, "fields": {...}}. Requests carry an id
(>= 1) chosen by the client; the server answers each with a "reply" (fields as REPLIES declares for the
request) or an "error" of the same id. Events (EVENTS) and errors that answer no request carry id 0. Every
size and field is capped; nothing but JSON and raw numbers ever crosses the wire. Cameras, images and points
travel in the encodings of codecs.py; training settings are those of settings.py.
"""
from __future__ import annotations

import ipaddress
import json
import re
import socket
import struct
import time
from dataclasses import dataclass

import numpy as np

from . import reconstruction
from .codecs import CAMERA, FRAME_FORMATS, MAX_IMAGE_BYTES, MAX_IMAGE_SIDE, MAX_POINTS, UPLOAD_FORMATS
from .schema import (MAX_TEXT_CHARS, AnyObject, Bool, Fields, Float, Int, Kind, Maybe, MessageSpec, Numbers, Str,
                     optional)
from .settings import BACKGROUND, SPZ_AXES, TRAINING, default

# 20: status's `reason` (why the training failed); 19: start_training's appearance (a training setting, so
# status's settings hold it too); 18: structure from motion (upload_photo, reconstruct, cancel_reconstruction,
# fetch_reconstruction and the reconstruction event);
# 17: load_ply's spz_axes (how an SPZ without a coordinate-system record is read); export_ply writes SOG and glTF
# names; 16: start_training's payload, a model to continue from that replaces the session's;
# 15: export_ply's `motion` (a 4D model's parameters and motion, for Blender's own splats); 14: convert_model's placement may be any invertible affine map; 13: status's `rendered` (the frames the server has rendered and answered); 12: convert_model (a model the client
# holds, as a file of another format); 11: start_training's image_formation (a training setting, so status's
# settings hold it too); 10: load_ply keeps the file in a new session, which opens (its reply names it); status's
# `checkpoint`: the session has a saved model (a checkpoint or the file it was imported from); 9: the "rgba32f"
# frame format, six shared-memory slots; 8: frames through shared memory on one machine (hello's shared_frames,
# render's shared, release_frame) and the "layer" frame format; 7: load_ply reads a 4D model's file and export_ply
# writes one (*.pt); status, render and export_ply say whether the model is 4D; 6: render streams; 5: render and
# export_ply name a session's saved model and a crop box, export_ply a placement; 4: load_ply and export_ply name
# their files (the splat format); 3: warning events; 2: replies and events declared and checked by the client
PROTOCOL_VERSION = 20
DEFAULT_PORT = 7380  # where `serve` listens and the add-on looks for a remote backend, unless told otherwise
MAGIC = b"SPW\x00"
PREFIX = struct.Struct(">4sI")  # magic, header length

MAX_HEADER_BYTES = 64 * 1024
MAX_HELLO_HEADER_BYTES = 32 * 1024  # all a peer may send before its hello is accepted (hello has no payload)
MAX_PAYLOAD_BYTES = 1 << 30
READ_CHUNK_BYTES = 1 << 20  # payloads are read in pieces of this size: memory grows with what arrives
MAX_ID = 2**53  # JSON numbers stay exact below this
MAX_TOKEN_CHARS = 4096
SHARED_SLOTS = 6  # frames a connection's shared-memory file holds at once (a live view holds its newest)
SESSION_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# Names Windows keeps for devices, with any extension: a folder of that name cannot be made there.
_DEVICE_NAME = re.compile(r"(con|prn|aux|nul|conin\$|conout\$|com[0-9]|lpt[0-9])(\..*)?", re.IGNORECASE)

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

# A session's training states; in the RUNNING ones its model belongs to the training thread.
STATES = ("idle", "training", "paused", "stopping", "stopped", "finished", "failed")
RUNNING = frozenset({"training", "paused", "stopping"})


class ProtocolError(Exception):
    """A message that breaks the protocol. `fatal`: the stream is out of step and must be closed.
    `request_id`: the id of the offending request when it could be read, else 0."""

    def __init__(self, code: str, message: str, fatal: bool = False, request_id: int = 0):
        super().__init__(message)
        self.code, self.message, self.fatal, self.request_id = code, message, fatal, request_id


class ConnectionClosed(Exception):
    """The peer closed the connection cleanly between frames."""


class PhotoFile(Kind):
    """The name of an uploaded photo or video: a plain file name (no folder) ending as a photo or a video does."""

    def check(self, value):
        name = Str(255).check(value)
        if not re.fullmatch(r"[^/\\:\x00]+", name) or name in (".", ".."):
            raise ValueError(f"{name[:40]!r} is not a plain file name")
        if not (reconstruction.is_photo(name) or reconstruction.is_video(name)):
            raise ValueError(f"{name[:40]!r} is neither a photo ({', '.join(reconstruction.PHOTO_SUFFIXES)}) nor a "
                             f"video ({', '.join(reconstruction.VIDEO_SUFFIXES)})")
        return name


class SessionName(Kind):
    """A session's folder name, the same on every system: up to 64 letters, digits and _ . - starting with a
    letter or digit, not ending in a dot, and not a Windows device name (CON, NUL, COM1, ...)."""

    def check(self, value):
        name = Str(64).check(value)
        if not re.fullmatch(SESSION_NAME, name):
            raise ValueError(f"{name[:40]!r}: use up to 64 letters, digits, '_', '.' and '-', starting with a "
                             "letter or digit")
        if name.endswith("."):
            raise ValueError(f"{name!r} ends with a dot, which Windows drops from folder names")
        if _DEVICE_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is a device name on Windows; choose another name")
        return name


SCALE_TOLERANCE = 1e-4  # relative difference between the axes' scales that still counts as uniform


def placement_scale(matrix, what: str = "the matrix") -> float:
    """The scale of a 4x4 placement made of a rotation, a translation and one scale for all axes; raises
    ValueError, naming `what`, for anything else (splat models take no other transform)."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (4, 4) or not np.all(np.isfinite(m)) or not np.allclose(m[3], [0.0, 0.0, 0.0, 1.0]):
        raise ValueError(f"{what} is not an affine 4x4 placement")
    linear = m[:3, :3]
    scales = np.linalg.norm(linear, axis=0)
    scale = float(scales.mean())
    if scale <= 0.0 or np.linalg.det(linear) <= 0.0:
        raise ValueError(f"{what} has a zero or mirroring scale; give it a positive scale")
    rotation = linear / scale
    if (np.abs(scales - scale).max() > SCALE_TOLERANCE * scale
            or not np.allclose(rotation.T @ rotation, np.eye(3), atol=SCALE_TOLERANCE)):
        raise ValueError(f"{what} is scaled unevenly ({', '.join(f'{s:.4g}' for s in scales)}) or sheared; "
                         "splat models take one scale for all axes, so give X, Y and Z the same scale")
    return scale


AFFINE_CONDITION_LIMIT = 1e8  # the most a placement's largest scale may exceed its smallest (its 3x3's condition)


def affine_placement(matrix, what: str = "the matrix") -> np.ndarray:
    """A 4x4 affine placement of any invertible linear part (uneven scales, shears, mirrors: a static model
    takes them; backend/placement.py) as a float64 array; raises ValueError, naming `what`, for anything else."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (4, 4) or not np.all(np.isfinite(m)) or not np.allclose(m[3], [0.0, 0.0, 0.0, 1.0]):
        raise ValueError(f"{what} is not an affine 4x4 placement")
    scales = np.linalg.svd(m[:3, :3], compute_uv=False)
    if scales.min() <= 0.0 or scales.max() > AFFINE_CONDITION_LIMIT * scales.min():
        raise ValueError(f"{what} flattens the model (a scale of 0 along some axis); give every axis a scale")
    return m


class Matrix(Kind):
    """A 4x4 affine matrix (rows; the last one 0 0 0 1) of finite numbers, decoded to a float64 array; with
    `placement`, only a rotation, a translation and one positive scale (placement_scale); with `affine`, any
    invertible affine placement (affine_placement)."""

    def __init__(self, placement: bool = False, affine: bool = False):
        self.numbers, self.placement, self.affine = Numbers((4, 4)), placement, affine

    def check(self, value) -> np.ndarray:
        m = np.array(self.numbers.check(value), dtype=np.float64)
        if self.affine:
            affine_placement(m)
        elif self.placement:
            placement_scale(m)
        elif not np.allclose(m[3], [0.0, 0.0, 0.0, 1.0]):
            raise ValueError(f"the last row is {' '.join(f'{x:g}' for x in m[3])}, not 0 0 0 1 (an affine matrix)")
        return m

    def encode(self, value):
        return self.numbers.encode(np.asarray(value, dtype=np.float64))


# ---- the messages ----

COUNT = Int(0, 2**53)
NUMBER = Float(-1e300, 1e300)
# Which model a render or an export is of, and the part of it kept. `model`: a session whose saved model (its last
# checkpoint, or the file an import made it from) is drawn, the open session's model as it is now when it names
# that one; null: the shown model. `crop`: model space into a box's unit cube [-1, 1]^3; only the Gaussians whose centres fall inside it are
# kept (null: all of them). `time`: when a 4D model is drawn, normalised over its captured frames (0 the first, 1
# the last; null: 0); a static model is the same at every time.
MODEL_CHOICE = Fields(model=optional(Maybe(SessionName()), None), crop=optional(Maybe(Matrix()), None),
                      time=optional(Maybe(Float(0.0, 1.0)), None))

REQUESTS: dict[str, MessageSpec] = {
    "hello": MessageSpec(Fields(token=Str(MAX_TOKEN_CHARS), protocol=Int(0, 2**31),
                                client=optional(Str(200), ""),
                                shared_frames=optional(Bool(), False, "the client runs on the backend's machine "
                                                       "and can read frames from a shared-memory file"))),
    "capabilities": MessageSpec(),
    "status": MessageSpec(),
    "open_session": MessageSpec(Fields(name=SessionName(), create=optional(Bool(), True))),
    "add_view": MessageSpec(Fields(camera=CAMERA, format=Str(choices=UPLOAD_FORMATS),
                                   name=optional(Str(200), ""),
                                   time=optional(Maybe(Float(0.0, 1.0)), None, "when the view is seen (the D-NeRF "
                                                 "time over the captured frames): a session whose views all have "
                                                 "one trains a 4D model; null: a static scene")),
                            MAX_IMAGE_BYTES),
    "set_points": MessageSpec(Fields(count=Int(1, MAX_POINTS)), MAX_POINTS * 15),
    # Payload (optional): a model to continue from (a 3DGS PLY of the official layout, core/splats.py), such as what
    # an edited native splat object shows, in the session's model space. It replaces the session's trained model
    # (in memory or its checkpoint), which must be static: the step, schedule and random state go on, and Adam's
    # moments and the densification statistics start at zero for it. Not with `fresh`.
    "start_training": MessageSpec(TRAINING.extended(
        fresh=optional(Bool(), False, "ignore the session's checkpoint and start over")), MAX_PAYLOAD_BYTES),
    "pause": MessageSpec(),
    "resume": MessageSpec(),
    "stop": MessageSpec(),
    "render": MessageSpec(MODEL_CHOICE.extended(
        camera=CAMERA, format=optional(Str(choices=FRAME_FORMATS), "rgba8"), depth=optional(Bool(), False),
        stream=optional(Int(0, 2**31), 0, "a newer request of the same stream on the same connection supersedes "
                        "this one while it waits; other streams' requests wait their turn"),
        shared=optional(Bool(), False, "put a raw frame in a slot of the connection's shared-memory file (hello's "
                        "shared_frames) when one is free, instead of in the reply's payload"))),
    # The client is done with the frame in this slot of its shared-memory file: the backend may use it again.
    "release_frame": MessageSpec(Fields(slot=Int(0, SHARED_SLOTS - 1))),
    # `name`: the file the model is exported to, whose ending picks the format (backend/formats: *.ply,
    # *.compressed.ply, *.spz, *.splat, *.sog, *.glb, *.gltf, and meta.json, a SOG's folder, sent bundled as a
    # .sog; *.pt: a 4D model's own file, splats4d.pt, refused for a static model).
    # `placement`: model space into the space the file holds (e.g. the world
    # of a Blender scene), applied to the means, rotations and scales after the crop; null: model space.
    "export_ply": MessageSpec(MODEL_CHOICE.extended(name=optional(Str(255), "splats.ply"),
                                                    placement=optional(Maybe(Matrix(placement=True)), None),
                                                    motion=optional(Bool(), False, "a 4D model as a PLY of its "
                                                                    "parameters at each Gaussian's time centre with "
                                                                    "its motion (core/splats.MOTION_COLUMNS), "
                                                                    "whatever `name` and `time` say; a static model "
                                                                    "as its PLY"))),
    # Payload: a model the client holds (a 3DGS PLY of the official layout, core/splats.py), such as what a
    # native splat object shows; the reply's payload is it in the format `name` gives, placed by `placement`,
    # which may be any invertible affine map (a static model's: backend/placement.py), and the reply's note says
    # where an uneven scale or a shear leaves view-dependent colours inexact.
    "convert_model": MessageSpec(Fields(name=optional(Str(255), "splats.ply"),
                                        placement=optional(Maybe(Matrix(affine=True)), None)),
                                 MAX_PAYLOAD_BYTES),
    "save_checkpoint": MessageSpec(),
    "load_checkpoint": MessageSpec(),
    # Payload: a splat file in any format backend/formats reads, recognised by its content, or a 4D model's file
    # (splats4d.pt, a torch file: by a *.pt name or its content), drawn at each request's time; `name`, the file's
    # name, is for messages and for .splat, the one format without magic bytes; `spz_axes`, the axes an SPZ that
    # does not say its own is read in. The backend keeps the file in a new session named after it, which opens and
    # shows it.
    "load_ply": MessageSpec(Fields(background=optional(BACKGROUND, default("background")), name=optional(Str(255), ""),
                                   spz_axes=optional(Str(choices=SPZ_AXES), SPZ_AXES[0])),
                            MAX_PAYLOAD_BYTES),
    # Structure from motion of photos or a video into a COLMAP capture (backend/data/photos.py), on a thread of the
    # backend's: the photos (or the video) are uploaded with upload_photo, or named by `path` by a client on the
    # backend's machine; reconstruct starts it, `reconstruction` events follow it, and fetch_reconstruction sends the
    # capture made to a client on another machine.
    # Payload: a photo, or the part of one (or of a video) from `offset` on; `first` empties the upload.
    "upload_photo": MessageSpec(Fields(capture=SessionName(), file=PhotoFile(), offset=optional(COUNT, 0),
                                       first=optional(Bool(), False)), MAX_IMAGE_BYTES),
    "reconstruct": MessageSpec(Fields(capture=SessionName(),
                                      path=optional(Str(4096), "", "a folder of photos or a video on the backend's "
                                                    "machine, for a client there; empty: the photos uploaded"),
                                      rate=optional(Float(reconstruction.MIN_RATE, reconstruction.MAX_RATE), reconstruction.DEFAULT_RATE,
                                                    "frames taken a second of a video"))),
    "cancel_reconstruction": MessageSpec(),
    "fetch_reconstruction": MessageSpec(Fields(capture=SessionName())),
    "shutdown": MessageSpec(),
}

# Frames through shared memory (SHARED_SLOTS of `slot_bytes` each, slot k's bytes from k * slot_bytes on, in the
# file at `path`), offered in the hello's reply to a client that asked for them from the backend's own machine.
# A render reply in a slot names it (`shared_slot`, its frame `shared_bytes` long, no payload); the backend writes
# that slot again only once the client sent release_frame for it.
SHARED_FRAMES = Fields(path=Str(4096), slot_bytes=Int(1, 2**40))

# What a session is doing; `checkpoint`: it has a saved model (a checkpoint, or the splat file an import made it
# from); `settings` are the training settings it runs (or last ran) with, null before; `dynamic`: the model shown
# (an imported file's, else the trained one) is 4D, different at each time; `rendered`: the frames the server has
# rendered and answered since it started (a closed connection's waiting renders are dropped, not rendered);
# `reason`: while the state is failed, why (the error event's message), else null.
STATUS = Fields(session=Maybe(Str(64)), state=Str(choices=STATES), views=COUNT, step=COUNT, iterations=COUNT,
                gaussians=COUNT, checkpoint=Bool(), settings=Maybe(TRAINING), dynamic=optional(Bool(), False),
                rendered=optional(COUNT, 0), reason=optional(Maybe(Str(MAX_TEXT_CHARS)), None))

# The fields of each request's reply; the payloads are named in comments.
REPLIES: dict[str, Fields] = {
    "hello": STATUS.extended(protocol=Int(0, 2**31), server=Str(64),
                             shared_frames=optional(Maybe(SHARED_FRAMES), None)),
    "capabilities": Fields(python=Str(64), torch=Str(64), numpy=Str(64), protocol=Int(0, 2**31), device=Str(16),
                           rasterizer=Str(16), cuda_available=Bool(), torch_cuda=Maybe(Str(64)),
                           gpu=Maybe(Str(200)), gpu_memory_gb=Maybe(NUMBER), cuda_rasterizer=Bool(),
                           cuda_rasterizer_detail=Str()),
    "status": STATUS, "open_session": STATUS, "pause": STATUS, "resume": STATUS, "stop": STATUS,
    "load_checkpoint": STATUS, "shutdown": STATUS,
    "start_training": STATUS.extended(continued=Bool()),  # whether it went on from earlier steps
    "add_view": Fields(index=COUNT, views=COUNT),
    "set_points": Fields(points=COUNT, note=Str()),
    # Payload (or the shared slot's bytes): the frame (RGBA8 rows bottom-up, PNG, or a layer: colour and depth
    # packed, codecs.layer_pixels); with depth and another format than layer, a float32 plane of the
    # alpha-normalised view depth (rows bottom-up, codecs.DEPTH_BACKGROUND where nothing is drawn) follows at
    # depth_offset.
    "render": Fields(width=Int(1, MAX_IMAGE_SIDE), height=Int(1, MAX_IMAGE_SIDE), format=Str(choices=FRAME_FORMATS),
                     step=COUNT, sh_degree=Int(0, 3), background=BACKGROUND,  # what the frame is composited over
                     depth_offset=optional(Maybe(COUNT)),
                     dynamic=optional(Bool(), False),  # a 4D model's frame is of its time; a static one's of any
                     shared_slot=optional(Maybe(Int(0, SHARED_SLOTS - 1)), None),
                     shared_bytes=optional(Maybe(COUNT), None)),
    # Payload: the file in the format its name gave. `path`: where the session keeps its trained model as a PLY
    # (empty for a viewed model). `note`: what the format left out (a .splat keeps no SH beyond degree 0).
    # `dynamic`: the model is 4D (the file then holds it at the time asked for, unless it is its own .pt).
    "export_ply": Fields(path=Str(), gaussians=COUNT, step=COUNT, format=Str(40), note=Str(),
                         dynamic=optional(Bool(), False)),
    "convert_model": Fields(gaussians=COUNT, format=Str(40), note=Str()),  # payload: the file
    "save_checkpoint": Fields(step=COUNT, path=Str()),
    # whether it is 4D: the status's `dynamic`
    "load_ply": Fields(gaussians=COUNT, sh_degree=Int(0, 3), session=SessionName()),
    "release_frame": Fields(),
    "upload_photo": Fields(files=COUNT, bytes=COUNT),  # in the capture's upload so far
    "reconstruct": Fields(capture=SessionName(), source=Str(4096)),  # what it reconstructs, as the backend names it
    "cancel_reconstruction": Fields(running=Bool()),  # whether one was running (it stops at its next report)
    "fetch_reconstruction": Fields(capture=SessionName(), bytes=COUNT),  # payload: core/reconstruction.pack_capture
}
assert set(REPLIES) == set(REQUESTS)

ERROR = Fields(code=Str(40), message=Str(MAX_TEXT_CHARS))
EVENTS: dict[str, Fields] = {
    "progress": Fields(state=Str(choices=STATES), step=COUNT, iterations=COUNT, loss=Maybe(NUMBER),
                       psnr=Maybe(NUMBER), gaussians=COUNT, views=COUNT, its_per_s=NUMBER,
                       gpu_memory_mb=Maybe(NUMBER)),  # loss and psnr are null until measured
    "state": STATUS,
    "error": ERROR,
    # Something the user should know that failed nothing, e.g. the unreadable parts a session opened without.
    "warning": Fields(message=Str(MAX_TEXT_CHARS)),
    # A reconstruction's progress (`stage` with `done` of `total`) while it runs, then how it ended: finished (the
    # capture in `folder` on the backend's machine, `registered` of `photos` with `points` 3D points), failed or
    # cancelled (`message` says why).
    "reconstruction": Fields(capture=SessionName(), state=Str(choices=reconstruction.STATES),
                             stage=optional(Str(choices=("",) + reconstruction.STAGES), ""), done=optional(COUNT, 0),
                             total=optional(COUNT, 0), message=optional(Str(MAX_TEXT_CHARS), ""),
                             folder=optional(Str(4096), ""), registered=optional(COUNT, 0),
                             photos=optional(COUNT, 0), points=optional(COUNT, 0)),
}


class Event(Kind):
    """{"event": kind, ...fields of EVENTS[kind]}."""

    def check(self, value):
        if not isinstance(value, dict) or value.get("event") not in EVENTS:
            raise ValueError(f"expected an event, one of {', '.join(EVENTS)}")
        fields = dict(value)
        kind = fields.pop("event")
        return {"event": kind, **EVENTS[kind].check(fields)}


SERVER_MESSAGES: dict[str, MessageSpec] = {
    "reply": MessageSpec(AnyObject(), MAX_PAYLOAD_BYTES),  # checked against REPLIES by the one who asked
    "error": MessageSpec(ERROR),
    "event": MessageSpec(Event()),
}


@dataclass
class Message:
    type: str
    id: int
    fields: dict
    # A received payload is the bytearray it was read into (no copy), or a borrowed shared-memory frame's view.
    payload: bytes | bytearray | memoryview = b""


# ---- framing ----

def encode_message(specs: dict[str, MessageSpec], type: str, id: int, fields: dict | None = None,
                   payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    """The frame's parts (prefix + header, payload), checked against `specs` as the receiver will."""
    spec = specs.get(type)
    if spec is None:
        raise ValueError(f"unknown message type {type!r}")
    wire = spec.fields.encode({} if fields is None else fields)
    spec.fields.check(wire)
    if len(payload) > spec.max_payload:
        raise ValueError(f"{type}: payload of {len(payload)} bytes exceeds its cap of {spec.max_payload}")
    return [encode_header(type, id, wire, len(payload)), payload]


def encode_reply(request_type: str, id: int, fields: dict, payload: bytes | memoryview = b"") -> list:
    """The frame of a reply to a `request_type` request, its fields checked against REPLIES."""
    spec = REPLIES[request_type]
    wire = spec.encode(fields)
    try:
        spec.check(wire)
    except ValueError as e:
        raise ValueError(f"reply to {request_type}: {e}") from None
    return encode_message(SERVER_MESSAGES, "reply", id, wire, payload)


def check_reply(request_type: str, message: "Message") -> "Message":
    """`message` with its fields checked against REPLIES[request_type] (defaults filled in)."""
    try:
        fields = REPLIES[request_type].check(message.fields)
    except ValueError as e:
        raise ProtocolError(BAD_FRAME, f"reply to {request_type}: {e}") from None
    return Message(message.type, message.id, fields, message.payload)


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


def recv_exact(sock: socket.socket, n: int, at_boundary: bool = False, deadline: float | None = None) -> bytearray:
    """Exactly `n` bytes, received straight into the buffer returned, which grows (doubling, from
    READ_CHUNK_BYTES) as they arrive, so a size declared but not sent costs no memory. A peer that closes
    before the first byte at a frame boundary raises ConnectionClosed; one that closes anywhere else left a
    frame unfinished. `deadline` (time.monotonic()) bounds the whole read: TimeoutError once it passes, however
    slowly the bytes trickle in."""
    buf, got = bytearray(min(n, READ_CHUNK_BYTES)), 0
    while got < n:
        if got == len(buf):
            buf.extend(bytes(min(len(buf), n - len(buf))))
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the deadline passed")
            sock.settimeout(left)
        received = sock.recv_into(memoryview(buf)[got:])  # the view is gone before the buffer next grows
        if not received:
            if at_boundary and not got:
                raise ConnectionClosed("peer closed the connection")
            raise ProtocolError(BAD_FRAME, f"connection closed mid-frame ({got} of {n} bytes received)",
                                fatal=True)
        got += received
    return buf


def read_message(sock: socket.socket, specs: dict[str, MessageSpec], max_header: int = MAX_HEADER_BYTES,
                 deadline: float | None = None) -> Message:
    """Read and validate one frame. Raises ConnectionClosed at a clean end of stream and ProtocolError
    for a bad frame (fatal when the stream can no longer be followed). A payload over its type's cap in
    `specs` is refused before any of it is read; `deadline` as recv_exact's."""
    magic, header_size = PREFIX.unpack(recv_exact(sock, PREFIX.size, at_boundary=True, deadline=deadline))
    if magic != MAGIC:
        raise ProtocolError(BAD_FRAME, f"frame does not start with {MAGIC!r} (got {bytes(magic)!r}); "
                            "is the peer a Splatwright client or server of this protocol?", fatal=True)
    if header_size > max_header:
        raise ProtocolError(TOO_LARGE, f"header of {header_size} bytes exceeds the cap of {max_header}",
                            fatal=True)
    type, request_id, payload_size, fields = parse_header(recv_exact(sock, header_size, deadline=deadline))
    spec = specs.get(type)
    max_payload = spec.max_payload if spec else 0
    if payload_size > max_payload:
        raise ProtocolError(TOO_LARGE, f"{type[:40]!r}: payload of {payload_size} bytes exceeds its cap of "
                            f"{max_payload}", fatal=True, request_id=request_id)
    payload = recv_exact(sock, payload_size, deadline=deadline) if payload_size else b""
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



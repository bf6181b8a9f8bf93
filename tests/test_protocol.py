"""The wire protocol on its own: framing round trips, caps, malformed input, wire encodings."""
from __future__ import annotations

import io
import json
import socket
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from blender_addon.core import codecs, protocol
from blender_addon.core.cameras import Camera
from blender_addon.core.protocol import REQUESTS, SERVER_MESSAGES, ProtocolError
from server_helpers import CAMERA, roundtrip


def frame(header: dict | bytes, payload: bytes = b"", magic: bytes = protocol.MAGIC) -> bytes:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return protocol.PREFIX.pack(magic, len(body)) + body + payload


def test_request_round_trip_with_payload_and_defaults():
    payload = bytes(range(256)) * 12
    parts = protocol.encode_message(REQUESTS, "add_view", 7, {"camera": CAMERA, "format": "rgb8"}, payload[:3072])
    m = roundtrip(parts)
    assert (m.type, m.id, m.payload) == ("add_view", 7, payload[:3072])
    assert codecs.camera_to_wire(m.fields["camera"]) == CAMERA and m.fields["name"] == ""  # the default filled in
    m = roundtrip(protocol.encode_message(REQUESTS, "start_training", 1, {"iterations": 10}))
    assert m.fields["iterations"] == 10 and m.fields["checkpoint_every"] == 500 and m.fields["fresh"] is False


def test_server_messages_round_trip():
    progress = {"event": "progress", "state": "training", "step": 3, "iterations": 10, "loss": None, "psnr": 21.5,
                "gaussians": 100, "views": 4, "its_per_s": 2.0, "gpu_memory_mb": None}
    m = roundtrip(protocol.encode_message(SERVER_MESSAGES, "event", 0, progress), SERVER_MESSAGES)
    assert m.fields == progress
    with pytest.raises(ValueError, match="missing field 'state'"):  # events are declared like requests
        protocol.encode_message(SERVER_MESSAGES, "event", 0, {"event": "progress", "step": 3})
    m = roundtrip(protocol.encode_message(SERVER_MESSAGES, "error", 4, {"code": "busy", "message": "x"}),
                  SERVER_MESSAGES)
    assert (m.type, m.id, m.fields["code"]) == ("error", 4, "busy")


def test_clean_close_and_close_mid_frame():
    with pytest.raises(protocol.ConnectionClosed):
        roundtrip(b"")
    good = b"".join(bytes(p) for p in protocol.encode_message(REQUESTS, "pause", 1))
    for cut in (3, len(protocol.MAGIC) + 4 + 5, len(good) - 1):
        with pytest.raises(ProtocolError, match="mid-frame") as e:
            roundtrip(good[:cut])
        assert e.value.fatal


@pytest.mark.parametrize("data, code, fatal", [
    (frame({"type": "pause", "id": 1, "payload_size": 0, "fields": {}}, magic=b"HTTP"), "bad_frame", True),
    (protocol.PREFIX.pack(protocol.MAGIC, protocol.MAX_HEADER_BYTES + 1), "too_large", True),
    (frame(b"{not json"), "bad_frame", True),
    (frame(b"\xff\xfe"), "bad_frame", True),
    (frame(b"[" * 50_000), "bad_frame", True),  # nesting deep enough to blow the parser's recursion
    (frame(b'{"type":"pause","id":1,"payload_size":' + b"9" * 5000 + b',"fields":{}}'), "bad_frame", True),
    (frame({"type": "pause", "id": 1, "payload_size": 0}), "bad_frame", True),
    (frame({"type": "pause", "id": -1, "payload_size": 0, "fields": {}}), "bad_frame", True),
    (frame({"type": "pause", "id": True, "payload_size": 0, "fields": {}}), "bad_frame", True),
    (frame({"type": 5, "id": 1, "payload_size": 0, "fields": {}}), "bad_frame", True),
    (frame({"type": "pause", "id": 1, "payload_size": protocol.MAX_PAYLOAD_BYTES + 1, "fields": {}}),
     "bad_frame", True),
    (frame({"type": "pause", "id": 3, "payload_size": 1, "fields": {}}, b"x"), "too_large", True),
    (frame({"type": "render", "id": 3, "payload_size": 10, "fields": {}}, b"x" * 10), "too_large", True),
    (frame({"type": "nope", "id": 3, "payload_size": 0, "fields": {}}), "bad_request", False),
    (frame({"type": "pause", "id": 3, "payload_size": 0, "fields": []}), "bad_request", False),
    (frame({"type": "pause", "id": 3, "payload_size": 0, "fields": {"x": 1}}), "bad_request", False),
    (frame({"type": "open_session", "id": 3, "payload_size": 0, "fields": {}}), "bad_request", False),
])
def test_malformed_frames(data, code, fatal):
    with pytest.raises(ProtocolError) as e:
        roundtrip(data)
    assert (e.value.code, e.value.fatal) == (code, fatal)
    assert e.value.message
    if not fatal:
        assert e.value.request_id == 3  # so the error reply can name the request


def test_unknown_type_consumes_nothing_after_it():
    """A non-fatal error leaves the stream in step: the next frame reads normally."""
    bad = frame({"type": "nope", "id": 1, "payload_size": 0, "fields": {}})
    good = b"".join(bytes(p) for p in protocol.encode_message(REQUESTS, "stop", 2))
    a, b = socket.socketpair()
    with a, b:
        a.sendall(bad + good)
        with pytest.raises(ProtocolError):
            protocol.read_message(b, REQUESTS)
        assert protocol.read_message(b, REQUESTS).type == "stop"


@pytest.mark.parametrize("fields, problem", [
    ({"name": "../etc"}, "use up to 64 letters"),
    ({"name": ""}, "use up to 64 letters"),
    ({"name": "a."}, "ends with a dot"),
    ({"name": "CON"}, "device name on Windows"),
    ({"name": "nul"}, "device name on Windows"),
    ({"name": "com1"}, "device name on Windows"),
    ({"name": "Aux.scene"}, "device name on Windows"),
    ({"name": "a" * 65}, "more than 64"),
    ({"name": 3}, "expected a string"),
    ({"name": "ok", "create": 1}, "expected true or false"),
    ({"name": "ok", "extra": 1}, "unknown field 'extra'"),
])
def test_field_validation(fields, problem):
    with pytest.raises(ProtocolError, match=problem):
        roundtrip(frame({"type": "open_session", "id": 1, "payload_size": 0, "fields": fields}))
    with pytest.raises(ValueError, match=problem):  # the sender checks the same definition
        protocol.encode_message(REQUESTS, "open_session", 1, fields)


@pytest.mark.parametrize("camera, problem", [
    ({**CAMERA, "width": 0}, "outside"),
    ({**CAMERA, "height": codecs.MAX_IMAGE_SIDE + 1}, "outside"),
    ({**CAMERA, "c2w": CAMERA["c2w"][:3]}, "shape"),
    ({**CAMERA, "K": [[1, 0, 0], [0, 1, 0], [0, 0, "1"]]}, "expected a number"),
    ({**CAMERA, "K": [[float("nan"), 0, 0], [0, 1, 0], [0, 0, 1]]}, "outside"),
    ({**CAMERA, "c2w": [[1e300] * 4] * 4}, "outside"),
])
def test_camera_validation(camera, problem):
    with pytest.raises(ValueError, match=problem):
        REQUESTS["render"].fields.check({"camera": camera})


def test_camera_wire_round_trip():
    K = np.array([[50.0, 0, 16.5], [0, 51.0, 15.5], [0, 0, 1]])
    c2w = np.eye(4)
    c2w[:3, 3] = [1, 2, 3]
    wire = json.loads(json.dumps(codecs.camera_to_wire(Camera(c2w, K, 33, 31))))
    back = codecs.camera_from_wire(wire)
    assert np.array_equal(back.c2w, c2w) and np.array_equal(back.K, K) and (back.width, back.height) == (33, 31)
    with pytest.raises(ValueError, match="fx, fy > 0"):
        codecs.camera_from_wire({**wire, "K": [[0, 0, 1], [0, 1, 1], [0, 0, 1]]})
    sheared = np.array(wire["c2w"])
    sheared[0, 1] = 0.5
    with pytest.raises(ValueError, match="proper rotation"):
        codecs.camera_from_wire({**wire, "c2w": sheared.tolist()})
    # A request carries a Camera and its receiver gets one back.
    m = roundtrip(protocol.encode_message(REQUESTS, "render", 2, {"camera": Camera(c2w, K, 33, 31)}))
    assert isinstance(m.fields["camera"], Camera) and np.array_equal(m.fields["camera"].c2w, c2w)


@pytest.mark.parametrize("shape, dtype, format", [((5, 7, 3), np.uint8, "rgb8"), ((5, 7, 4), np.uint8, "rgba8"),
                                                  ((5, 7, 3), np.float16, "rgb16f"),
                                                  ((5, 7, 4), np.float16, "rgba16f")])
def test_raw_image_round_trip(shape, dtype, format):
    image = (np.random.default_rng(0).random(shape) * (255 if dtype == np.uint8 else 1)).astype(dtype)
    name, payload = codecs.image_to_wire(image)
    assert name == format
    assert np.array_equal(codecs.image_from_wire(name, bytes(payload), 7, 5), image)
    with pytest.raises(ValueError, match="payload bytes"):
        codecs.image_from_wire(name, bytes(payload)[:-1], 7, 5)
    with pytest.raises(ValueError, match="uint8 or float16"):
        codecs.image_to_wire(image.astype(np.float32))


def png_with_filters(rgba: np.ndarray, filters: list[int]) -> bytes:
    """A PNG whose row y uses filter filters[y] (0 None, 1 Sub; 4 Paeth is written as raw bytes)."""
    h, w, _ = rgba.shape
    rows = []
    for y in range(h):
        line = rgba[y].reshape(-1)
        if filters[y] == 1:
            line = line - np.concatenate([np.zeros(4, np.uint8), line[:-4]])  # wraps modulo 256
        rows.append(bytes([filters[y]]) + line.tobytes())
    png = codecs.encode_png(rgba)
    start = png.index(b"IDAT") - 4
    end = png.index(b"IEND") - 4
    body = zlib.compress(b"".join(rows))
    idat = struct.pack(">I", len(body)) + b"IDAT" + body + struct.pack(">I", zlib.crc32(b"IDAT" + body))
    return png[:start] + idat + png[end:]


def test_png_round_trip_and_filters():
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (37, 23, 4), dtype=np.uint8)
    data = codecs.encode_png(rgba)
    assert np.array_equal(codecs.decode_png(data), rgba)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), rgba)  # a standard PNG
    mixed = png_with_filters(rgba, [y % 2 for y in range(37)])
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(mixed))), rgba)
    assert np.array_equal(codecs.decode_png(mixed), rgba)
    with pytest.raises(ValueError, match="filter type 4"):
        codecs.decode_png(png_with_filters(rgba, [0] * 36 + [4]))


def test_png_decoder_rejects_bad_input():
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)
    data = codecs.encode_png(rgba)
    with pytest.raises(ValueError, match="not a PNG"):
        codecs.decode_png(b"GIF89a" + data)
    with pytest.raises(ValueError, match="over the cap"):
        codecs.decode_png(data, max_pixels=15)
    with pytest.raises(ValueError):
        codecs.decode_png(data[:40])
    buffer = io.BytesIO()
    Image.fromarray(rgba[..., :3]).save(buffer, format="PNG")
    with pytest.raises(ValueError, match="8-bit RGBA"):
        codecs.decode_png(buffer.getvalue())


def test_points_round_trip_and_checks():
    xyz = np.random.default_rng(2).normal(size=(10, 3)).astype(np.float32)
    rgb = np.arange(30, dtype=np.uint8).reshape(10, 3)
    xyz2, rgb2 = codecs.points_from_wire(codecs.points_to_wire(xyz, rgb), 10)
    assert np.array_equal(xyz2, xyz) and np.array_equal(rgb2, rgb)
    with pytest.raises(ValueError, match="150 payload bytes"):
        codecs.points_from_wire(b"\0" * 149, 10)
    bad = xyz.copy()
    bad[3, 1] = np.inf
    with pytest.raises(ValueError, match="NaN or infinity"):
        codecs.points_from_wire(codecs.points_to_wire(bad, rgb), 10)


def test_caps_on_the_sending_side():
    with pytest.raises(ValueError, match="payload"):
        protocol.encode_message(REQUESTS, "pause", 1, {}, b"x")
    with pytest.raises(ValueError, match="header"):
        protocol.encode_header("pause", 1, {"x": "y" * protocol.MAX_HEADER_BYTES}, 0)
    with pytest.raises(ValueError, match="unknown message type"):
        protocol.encode_message(REQUESTS, "reply", 1)
    assert struct.calcsize(">4sI") == protocol.PREFIX.size

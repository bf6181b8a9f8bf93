"""The frame path from the backend to the add-on's views: frames through shared memory against the same frames
through the socket, byte for byte (a real server subprocess on loopback, CPU), the slots' bookkeeping and its
refusals, the "layer" packing and the display floats made by the backend against the add-on's, and the frame
stream's reused buffers and held slots."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from blender_addon.logic import frames
from blender_addon.core import codecs, protocol
from blender_addon.logic.colors import display_pixels
from blender_addon.core.client import MappedFrames, RemoteError, decode_depth, decode_frame, decode_pixels
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import ProtocolError
from backend.service import shared_frames
from backend.service.frames import finish_frame, frame_bytes, packed_layer, queue_frame
from backend.policy import resolve_device
from backend.formats.ply import write_ply
from backend.render import camera_tensors, render
from helpers import orbit_cameras, random_gaussians, wait_until
from server_helpers import FakeClient

needs_shm = pytest.mark.skipif(not shared_frames.available(), reason="no /dev/shm on this system: frames go "
                               "through the socket only")
CAMERA = orbit_cameras(1, 40, 30)[0]
REQUESTS = [("rgba8", False), ("rgba8", True), ("layer", True), ("rgba32f", False), ("rgba32f", True)]  # format, depth


def viewed_model(client, folder) -> None:
    write_ply(folder / "model.ply", random_gaussians(300, seed=4, sh_degree=1))
    client.load_ply((folder / "model.ply").read_bytes())


def frames_of(client) -> list:
    return [client.submit_render(CAMERA, format, depth=depth).result(60) for format, depth in REQUESTS]


@needs_shm
def test_shared_memory_frames_equal_socket_frames_byte_for_byte(tmp_path, start_server):
    server = start_server(tmp_path / "work")
    with server.client() as client:
        slot_bytes = client.hello["shared_frames"]["slot_bytes"]
        assert client.shared is not None and slot_bytes >= 40 * 30 * codecs.MAX_RAW_FRAME_BYTES_PER_PIXEL
        path = client.hello["shared_frames"]["path"]
        viewed_model(client, tmp_path)
        shared = frames_of(client)
        # more frames than slots, one after another: each slot is released once its frame is copied out
        again = [client.render(CAMERA) for _ in range(2 * protocol.SHARED_SLOTS)]
    assert all(reply.fields["shared_slot"] is not None and reply.fields["shared_bytes"] is not None
               for reply in shared)
    wait_until(lambda: not os.path.exists(path))  # the file goes with its connection
    with server.client(shared_frames=False) as client:
        assert client.shared is None and client.hello["shared_frames"] is None
        through_socket = frames_of(client)
        with pytest.raises(RemoteError, match="no shared-memory frames"):
            client.request("render", {"camera": CAMERA, "shared": True})
    for a, b in zip(shared, through_socket):
        assert b.fields["shared_slot"] is None
        if a.fields["format"] == "rgba32f":  # display floats only in shared memory: through the socket as rgba8
            assert b.fields["format"] == "rgba8" and np.array_equal(decode_frame(a), decode_frame(b))
            if a.fields["depth_offset"] is not None:
                assert np.array_equal(decode_depth(a), decode_depth(b))
            continue
        assert bytes(a.payload) == bytes(b.payload) and a.fields["depth_offset"] == b.fields["depth_offset"]
    assert all(np.array_equal(frame, decode_frame(shared[0])) for frame in again)
    # The backend's layer is the add-on's packing of the same frame and depth, bit for bit.
    rgba, plain = decode_frame(shared[1]), decode_depth(shared[1])
    assert np.array_equal(decode_frame(shared[0]), rgba)
    assert decode_pixels(shared[2]).tobytes() == codecs.layer_pixels(rgba, plain).tobytes()
    assert (plain == codecs.DEPTH_BACKGROUND).any() and (plain < codecs.DEPTH_BACKGROUND).any()
    # The backend's display floats are the add-on's conversion of the same frame, bit for bit.
    for display in shared[3:]:
        assert decode_pixels(display).tobytes() == display_pixels(rgba).tobytes()
        assert np.array_equal(decode_frame(display), rgba)
    assert np.array_equal(decode_depth(shared[4]), plain)


@needs_shm
def test_a_borrowed_frame_is_read_in_its_slot_which_stays_taken_until_released(tmp_path, start_server):
    server = start_server(tmp_path / "work")
    with server.client() as client:
        viewed_model(client, tmp_path)
        copied = client.submit_render(CAMERA).result(60)
        borrowed = []
        for stream in range(protocol.SHARED_SLOTS):  # one after another: none supersedes another
            borrowed.append(client.submit_render(CAMERA, borrow=True, stream=stream))
            borrowed[-1].result(60)
        replies = [pending.result(60) for pending in borrowed]
        assert all(pending.holds_shared_frame and isinstance(reply.payload, memoryview)
                   for pending, reply in zip(borrowed, replies))
        assert not isinstance(copied.payload, memoryview)
        assert all(bytes(reply.payload) == bytes(copied.payload) for reply in replies)
        # Every slot is held: the next frame comes through the socket, whole, and display floats as rgba8.
        through_socket = client.submit_render(CAMERA).result(60)
        assert through_socket.fields["shared_slot"] is None and bytes(through_socket.payload) == bytes(copied.payload)
        as_bytes = client.submit_render(CAMERA, "rgba32f").result(60)
        assert as_bytes.fields["format"] == "rgba8" and bytes(as_bytes.payload) == bytes(copied.payload)
        for pending in borrowed:
            pending.release()
            pending.release()  # a second release does nothing
            assert not pending.holds_shared_frame and pending.result(0).payload == b""
        assert client.submit_render(CAMERA).result(60).fields["shared_slot"] is not None
        assert client.call("status")["state"] == "idle"  # no release was refused: the connection goes on


@needs_shm
def test_a_bad_release_is_an_error_reply_and_the_connection_goes_on(tmp_path, start_server):
    server = start_server(tmp_path / "work")
    with server.client() as client:
        with pytest.raises(RemoteError, match="slot 1 holds no frame"):
            client.call("release_frame", slot=1)
        with pytest.raises(ValueError, match="slot"):
            client.call("release_frame", slot=protocol.SHARED_SLOTS)
        assert client.call("status")["state"] == "idle"
    with server.client(shared_frames=False) as client:
        with pytest.raises(RemoteError, match="no shared-memory frames to release"):
            client.call("release_frame", slot=0)


@needs_shm
def test_a_slot_goes_to_the_client_only_when_sent_and_comes_back_once():
    ring = shared_frames.SharedFrames(64 * 64, cuda=False)
    mapped = MappedFrames.open(**ring.wire())  # as a client maps it, before its first shared render
    try:
        taken = [ring.take(64 * 64 * 4) for _ in range(protocol.SHARED_SLOTS)]
        assert sorted(slot.index for slot in taken) == list(range(protocol.SHARED_SLOTS))
        assert not os.path.exists(ring.wire()["path"])  # the name goes once the client has the file mapped
        assert ring.take(16) is None  # every slot busy: the frame goes in the reply
        with pytest.raises(SplatwrightError, match="holds no frame"):
            ring.release(taken[1].index)  # being written: not the client's to release
        ring.sent(taken[1].index)
        ring.release(taken[1].index)
        with pytest.raises(SplatwrightError, match="holds no frame"):
            ring.release(taken[1].index)
        with pytest.raises(SplatwrightError, match="holds no frame"):
            ring.release(protocol.SHARED_SLOTS)
        ring.discard(taken[2].index)  # a frame that is not sent frees its slot without the client
        assert ring.take(ring.slot_bytes + 1) is None
        slot = ring.take(100)
        assert slot.index in (taken[1].index, taken[2].index) and slot.bytes.numel() == 100
        slot.bytes.fill_(7)
        assert bytes(mapped.view(slot.index, 100)) == bytes([7]) * 100
        with pytest.raises(ProtocolError, match="does not fit"):
            mapped.view(slot.index, ring.slot_bytes + 1)
    finally:
        mapped.close()
        ring.close()


@needs_shm
def test_a_connection_closing_mid_frame_keeps_the_memory_until_the_frame_is_done():
    ring = shared_frames.SharedFrames(64 * 64, cuda=False)
    slot = ring.take(1000)
    ring.close()  # the client went while the render thread writes this slot
    assert not os.path.exists(ring.wire()["path"]) and ring.take(10) is None
    slot.bytes.fill_(3)  # still mapped: no crash
    assert int(slot.bytes.sum()) == 3000 and not ring.map.closed
    ring.discard(slot.index)
    assert ring.map.closed


@needs_shm
def test_files_of_killed_servers_are_removed_and_live_ones_kept(tmp_path):
    dead = shared_frames.FOLDER / f"{shared_frames.PREFIX}999999999-test"
    live = shared_frames.FOLDER / f"{shared_frames.PREFIX}{os.getpid()}-test"
    for path in (dead, live):
        path.write_bytes(b"x")
    try:
        shared_frames.remove_stale_files()
        assert not dead.exists() and live.exists()
    finally:
        for path in (dead, live):
            path.unlink(missing_ok=True)


def test_the_backend_packs_a_layer_as_the_add_on_does():
    rng = np.random.default_rng(3)
    rgba = rng.integers(0, 256, (7, 9, 4), dtype=np.uint8)
    rgba[0, :, 3] = 255  # alpha above 127: the sign bit of the packed word
    depth = np.exp(rng.uniform(np.log(1e-3), np.log(1e10), (7, 9))).astype(np.float32)
    depth[1] = codecs.DEPTH_BACKGROUND
    ours = packed_layer(torch.from_numpy(rgba), torch.from_numpy(depth)).numpy()
    assert ours.tobytes() == codecs.layer_pixels(rgba, depth).tobytes()


def test_the_cpu_renderer_frame_bytes_are_the_wire_formats():
    """A frame rendered on the CPU: rgba8 rows bottom-up, the depth plane after it, a PNG's rows top-down, the
    display floats of rgba8's bytes (sent as rgba8 without a shared slot)."""
    g = random_gaussians(200, seed=5, sh_degree=1)
    with torch.no_grad():
        out = render(g, CAMERA, 1, (1.0, 1.0, 1.0), "reference")
        queued = {(format, depth): finish_frame(queue_frame(g, CAMERA, 1, (1.0, 1.0, 1.0), "reference",
                                                            camera_tensors(CAMERA, "cpu"), format, depth))
                  for format, depth in REQUESTS + [("png", True)]}
    rgba = (torch.cat([out.image, out.alpha[..., None]], -1).clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()
    fields, payload = queued[("rgba8", False)]
    assert fields["depth_offset"] is None and bytes(payload) == rgba[::-1].tobytes()
    fields, payload = queued[("rgba8", True)]
    assert bytes(payload)[:fields["depth_offset"]] == rgba[::-1].tobytes()
    fields, payload = queued[("png", True)]
    assert np.array_equal(codecs.decode_png(payload[:fields["depth_offset"]]), rgba)
    assert bytes(payload[fields["depth_offset"]:]) == bytes(queued[("rgba8", True)][1])[rgba.nbytes:]
    assert frame_bytes(out, "rgba32f", False)[0].numpy().tobytes() == display_pixels(rgba[::-1]).tobytes()
    assert bytes(queued[("rgba32f", True)][1]) == bytes(queued[("rgba8", True)][1])  # no shared slot: as rgba8


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none); run on a GPU machine "
                    "such as the H200")
@needs_shm
def test_gpu_frames_reach_the_reply_and_a_shared_slot_as_the_device_made_them():
    device, rasterizer = resolve_device("cuda")
    g = random_gaussians(300, seed=4, sh_degree=1).to(device)
    view = camera_tensors(CAMERA, device)
    ring = shared_frames.SharedFrames(64 * 64, cuda=True)
    mapped = MappedFrames.open(**ring.wire())
    try:
        for format, depth in REQUESTS:
            payload_format = "rgba8" if format == "rgba32f" else format  # display floats only in a slot
            with torch.no_grad():
                out = render(g, CAMERA, 1, (1.0, 1.0, 1.0), rasterizer, view)
                expected = frame_bytes(out, format, depth)[0].cpu().numpy().tobytes()
                expected_payload = frame_bytes(out, payload_format, depth)[0].cpu().numpy().tobytes()
                _, payload = finish_frame(queue_frame(g, CAMERA, 1, (1.0, 1.0, 1.0), rasterizer, view, format, depth))
                fields, empty = finish_frame(queue_frame(g, CAMERA, 1, (1.0, 1.0, 1.0), rasterizer, view, format,
                                                         depth, ring))
            assert bytes(payload) == expected_payload and not empty and fields["shared_bytes"] == len(expected)
            assert bytes(mapped.view(fields["shared_slot"], len(expected))) == expected
            ring.discard(fields["shared_slot"])
            if format == "rgba32f":  # the device's display floats are the add-on's conversion, bit for bit
                colour = expected[:CAMERA.width * CAMERA.height * codecs.FRAME_ENCODINGS[format].bytes_per_pixel]
                rgba8 = np.frombuffer(expected_payload, np.uint8)[:CAMERA.width * CAMERA.height * 4]
                assert colour == display_pixels(rgba8).tobytes()
    finally:
        mapped.close()
        ring.close()


@needs_shm
def test_a_live_views_display_frames_hold_their_slots_until_they_go(tmp_path, start_server):
    """Through shared memory a frame stream gets the display floats made by the backend and reads them in their
    slot: a frame held is never written over, and the slots of frames let go come back (every later frame finds
    one)."""
    cameras = orbit_cameras(3 * protocol.SHARED_SLOTS, 40, 30)
    server = start_server(tmp_path / "work")
    with server.client() as client:
        viewed_model(client, tmp_path)
        expected = display_pixels(client.render(cameras[0]))
        stream = frames.FrameStream(lambda: client)

        def shown(tag: int) -> frames.Frame:
            stream.ask(cameras[tag], tag)
            wait_until(lambda: stream.error or (stream.frame is not None and stream.frame.tag == tag))
            assert not stream.error
            return stream.frame
        try:
            held = shown(0)
            later_slots = [shown(tag).fields["shared_slot"] for tag in range(1, len(cameras))]
        finally:
            stream.close()
    assert held.fields["format"] == "rgba32f" and not held.pixels.flags.writeable
    assert None not in later_slots and held.fields["shared_slot"] not in later_slots
    assert held.pixels.tobytes() == expected.tobytes()


def test_a_frame_streams_buffer_is_written_again_only_once_its_frame_is_gone():
    client = FakeClient()
    stream = frames.FrameStream(lambda: client)
    pixels = []  # of each frame, kept without the frame: a frame let go may give its buffer to a later one

    def answered(i: int, value: int):
        stream.ask(CAMERA.scaled(0.25), tag=i)
        wait_until(lambda: len(client.asked) == i + 1)
        client.answer(i, value=value)
        wait_until(lambda: stream.frame is not None and stream.frame.tag == i)
        pixels.append(stream.frame.pixels)
    try:
        answered(0, 10)
        held = stream.frame
        for i in (1, 2, 3):
            answered(i, 20 * i)
    finally:
        stream.close()
    np.testing.assert_allclose(held.pixels, 10 / 255.0, rtol=1e-6)  # never written again while held
    assert not any(np.shares_memory(held.pixels, later) for later in pixels[1:])
    assert np.shares_memory(pixels[1], pixels[3])  # frame 1 was gone when frame 3 came
    np.testing.assert_allclose(stream.frame.pixels, 60 / 255.0, rtol=1e-6)

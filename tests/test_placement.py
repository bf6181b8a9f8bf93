"""Splat models placed in the scene (blender_addon/logic/placement.py, bpy-free): the camera taken into the model's
space sees what the placed model would show, depths scale with the model, uneven scales are refused; frame
streams carry depth for composited views."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from blender_addon.logic import frames, placement
from blender_addon.core import codecs
from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from blender_addon.core.client import PendingReply
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import Message
from blender_addon.core.splats import read_ply_bytes
from backend.formats.ply import write_ply
from backend.render import render
from helpers import random_gaussians, wait_until


def rotation(axis, angle: float) -> np.ndarray:
    """Rodrigues' rotation matrix about `axis` by `angle` radians."""
    k = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    cross = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + math.sin(angle) * cross + (1 - math.cos(angle)) * cross @ cross


def placement_matrix(scale: float = 1.7) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3] = scale * rotation([0.3, -0.5, 0.8], 0.9)
    m[:3, 3] = [0.4, -1.2, 0.7]
    return m


CAMERA = Camera(look_at([4.0, -3.0, 2.5], [0.3, -0.8, 0.6]), intrinsics_from_fov_x(0.8, 64, 48), 64, 48)


def test_the_camera_in_model_space_sees_the_placed_points_where_the_scene_camera_does():
    m = placement_matrix()
    points = np.random.default_rng(0).uniform(-0.8, 0.8, (50, 3))
    world = points @ m[:3, :3].T + m[:3, 3]
    placed, depth_scale = placement.camera_in_model(CAMERA, m)
    uv_world, z_world = CAMERA.world_to_pixel(world)
    uv_model, z_model = placed.world_to_pixel(points)
    np.testing.assert_allclose(uv_model, uv_world, atol=1e-9)
    np.testing.assert_allclose(z_model * depth_scale, z_world, rtol=1e-12)
    assert depth_scale == pytest.approx(1.7)
    assert np.allclose(placed.c2w[:3, :3].T @ placed.c2w[:3, :3], np.eye(3))  # a rigid camera the wire takes


def test_the_object_origin_is_the_models_centre():
    obj = np.eye(4)
    obj[:3, 3] = [2.0, 3.0, 4.0]
    m = placement.model_to_world(obj, [2.0, 3.0, 4.0])
    np.testing.assert_allclose(m, np.eye(4))  # added where it was trained, the model stays there
    obj[:3, :3] = 2.0 * rotation([0, 0, 1], 0.5)
    m = placement.model_to_world(obj, [2.0, 3.0, 4.0])
    np.testing.assert_allclose(m @ [2.0, 3.0, 4.0, 1.0], [2.0, 3.0, 4.0, 1.0])  # it turns and scales about it


def test_the_backend_renders_the_placed_model_through_the_model_space_camera():
    """The rasterizer's frame of the model through the model-space camera is its frame of the model moved,
    turned and scaled into the world (degree 0: view-dependent colour would turn with it), depth included."""
    g = random_gaussians(200, seed=4, sh_degree=0, scale=0.06)
    m = placement_matrix(1.3)
    s, r, t = 1.3, m[:3, :3] / 1.3, m[:3, 3]
    w, x, y, z = rotation_quaternion(r)
    qw, qx, qy, qz = g.quats.unbind(-1)
    moved = g.detached()
    moved.means = (g.means.double() @ torch.from_numpy(m[:3, :3]).T + torch.from_numpy(t)).float()
    moved.log_scales = g.log_scales + math.log(s)
    moved.quats = torch.stack([w * qw - x * qx - y * qy - z * qz, w * qx + x * qw + y * qz - z * qy,
                               w * qy - x * qz + y * qw + z * qx, w * qz + x * qy - y * qx + z * qw], -1)
    placed, depth_scale = placement.camera_in_model(CAMERA, m)
    with torch.no_grad():
        in_world = render(moved, CAMERA, 0, (1.0, 1.0, 1.0))
        in_model = render(g, placed, 0, (1.0, 1.0, 1.0))
    assert in_world.alpha.max() > 0.9  # the model is in view
    torch.testing.assert_close(in_model.image, in_world.image, atol=2e-4, rtol=0)
    covered = in_world.alpha > 0.05
    torch.testing.assert_close(in_model.depth[covered] * depth_scale, in_world.depth[covered], rtol=1e-4, atol=1e-4)


def rotation_quaternion(r: np.ndarray) -> tuple[float, float, float, float]:
    """(w, x, y, z) of a rotation matrix whose angle is below pi."""
    w = math.sqrt(1.0 + np.trace(r)) / 2.0
    return w, (r[2, 1] - r[1, 2]) / (4 * w), (r[0, 2] - r[2, 0]) / (4 * w), (r[1, 0] - r[0, 1]) / (4 * w)


@pytest.mark.parametrize("linear, says", [
    (np.diag([1.0, 2.0, 1.0]), "scaled unevenly"),
    (np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), "sheared"),
    (np.diag([-1.0, 1.0, 1.0]), "mirroring"),
    (np.zeros((3, 3)), "zero"),
])
def test_uneven_scales_shears_and_mirrors_are_refused_with_what_to_do(linear, says):
    m = np.eye(4)
    m[:3, :3] = linear
    with pytest.raises(SplatwrightError, match=says) as refused:
        placement.camera_in_model(CAMERA, m, "Splats")
    assert str(refused.value).startswith("Splats ")
    assert placement.uniform_scale(np.diag([2.5, 2.5, 2.5, 1.0])) == pytest.approx(2.5)


def test_model_bounds_leave_out_stray_gaussians(tmp_path):
    g = random_gaussians(400, seed=2, sh_degree=1)
    g.means = g.means * torch.tensor([1.0, 2.0, 0.5]) + torch.tensor([3.0, -1.0, 2.0])
    g.means[0] = torch.tensor([100.0, 100.0, 100.0])  # a floater
    write_ply(tmp_path / "model.ply", g)
    centre, half_size = placement.model_bounds(read_ply_bytes((tmp_path / "model.ply").read_bytes()).means)
    np.testing.assert_allclose(centre, [3.0, -1.0, 2.0], atol=0.1)
    assert 0.7 < half_size < 0.8 * 2.0  # the box's largest side (y: 2 x 0.8), without the floater


class DepthClient:
    """submit_render answered at once with a frame and its depth plane, as the server sends them."""
    frame_format = "rgba8"

    def __init__(self):
        self.asked: list[tuple] = []  # (format, depth) of each request

    def submit_render(self, camera, format=None, depth=False, on_done=None, stream=0, borrow=False):
        self.asked.append((format, depth))
        pending = PendingReply("render", on_done, borrow)
        rgba = np.full((camera.height, camera.width, 4), 200, np.uint8)
        plane = np.arange(camera.width * camera.height, dtype="<f4")
        fields = {"width": camera.width, "height": camera.height, "format": format or "rgba8", "step": 0,
                  "sh_degree": 0, "background": [1.0, 1.0, 1.0], "depth_offset": None}
        if format == "layer":  # the backend packs it as codecs.layer_pixels does
            payload = codecs.layer_pixels(rgba, plane).tobytes()
        else:
            payload = rgba.tobytes() + (plane.tobytes() if depth else b"")
            fields["depth_offset"] = rgba.nbytes if depth else None
        pending._finish(Message("reply", 1, fields, payload))
        return pending


def test_a_frame_stream_with_depth_carries_the_depth_plane_packed_with_the_colour():
    client = DepthClient()
    stream = frames.FrameStream(lambda: client)
    stream.depth = True
    try:
        stream.ask(CAMERA.scaled(0.25))
        wait_until(lambda: stream.frame is not None)
    finally:
        stream.close()
    assert client.asked == [("layer", True)]  # on loopback the backend packs them
    rgba, depth = codecs.unpacked_layer(stream.frame.pixels)
    assert stream.frame.pixels.dtype == np.float32 and np.all(np.isfinite(stream.frame.pixels))
    assert np.all(rgba == 200)
    np.testing.assert_allclose(depth, np.arange(16 * 12, dtype=np.float32), rtol=2.0**-15)

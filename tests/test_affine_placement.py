"""A static model placed by any invertible affine map (backend/placement.py's convention): means by the map,
covariances A Sigma A^T decomposed back into rotations and scales, view-dependent colours turned by the polar
rotation (exactly, mirrors included, where the map is one scale for all axes; a note says where not); the placed
model renders as the model seen through the map; convert_model takes such maps, export_ply does not."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from blender_addon.core import protocol
from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from backend.formats.ply import encode_ply, read_ply
from backend.metrics import psnr
from backend.placement import affine_placed, placed, placement_notes, polar_rotation
from backend.render import render, rasterizer_fn
from backend.render.reference import quat_to_rotmat
from backend.service.exports import convert
from backend.sh import sh_to_rgb
from helpers import random_gaussians

CAMERA = Camera(look_at([3.5, -3.0, 2.5], [0.2, 0.1, 0.3]), intrinsics_from_fov_x(0.8, 96, 72), 96, 72)


def rotation(axis, angle: float) -> np.ndarray:
    k = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    cross = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + math.sin(angle) * cross + (1 - math.cos(angle)) * cross @ cross


def affine(linear, translation=(0.4, -0.3, 0.2)) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3], m[:3, 3] = linear, translation
    return m


# moved, turned, scaled unevenly and sheared (as a child turned under a parent scaled unevenly is)
SHEARED = affine(np.diag([1.0, 1.6, 0.6]) @ rotation([0.2, 0.9, -0.3], 0.7) @ np.diag([1.2, 0.8, 1.0]))


def covariances(g) -> torch.Tensor:
    m = quat_to_rotmat(g.quats.double()) * torch.exp(g.log_scales.double())[:, None, :]
    return m @ m.mT


def test_means_and_covariances_follow_the_map():
    g = random_gaussians(200, seed=3, sh_degree=0).to(dtype=torch.float64)
    for m in (SHEARED, affine(np.diag([1.0, -1.3, 0.7]) @ rotation([1, 1, 0], 0.4))):  # sheared; mirrored
        out = affine_placed(g, m)
        a = torch.from_numpy(m[:3, :3])
        torch.testing.assert_close(out.means, g.means @ a.T + torch.from_numpy(m[:3, 3]), atol=1e-12, rtol=0)
        torch.testing.assert_close(covariances(out), a @ covariances(g) @ a.T, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(out.quats.norm(dim=-1), torch.ones(200, dtype=torch.float64))


def test_a_similarity_places_the_same_model_by_either_path():
    g = random_gaussians(100, seed=5, sh_degree=3).to(dtype=torch.float64)
    m = affine(1.7 * rotation([0.3, -0.5, 0.8], 0.9))
    general, similar = affine_placed(g, m), placed(g, m)
    torch.testing.assert_close(general.means, similar.means)
    torch.testing.assert_close(covariances(general), covariances(similar), atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(general.sh_rest, similar.sh_rest, atol=1e-10, rtol=0)
    assert placement_notes(g, m) == []


def test_colours_turn_exactly_under_a_mirror_and_by_the_polar_rotation_otherwise():
    g = random_gaussians(50, seed=6, sh_degree=3).to(dtype=torch.float64)
    dirs = torch.nn.functional.normalize(torch.randn(50, 3, dtype=torch.float64), dim=-1)
    mirror = affine(1.3 * np.diag([1.0, 1.0, -1.0]) @ rotation([0.1, 0.7, 0.2], 1.1))
    out = affine_placed(g, mirror)
    q = torch.from_numpy(mirror[:3, :3] / 1.3)  # seen along Q d, the placed colour is the model's along d
    torch.testing.assert_close(sh_to_rgb(out.sh, dirs @ q.T, 3), sh_to_rgb(g.sh, dirs, 3), atol=1e-10, rtol=0)
    turn, mirrored = polar_rotation(SHEARED[:3, :3])
    assert not mirrored and np.allclose(turn.T @ turn, np.eye(3)) and np.linalg.det(turn) > 0
    sheared = affine_placed(g, SHEARED)
    t = torch.from_numpy(turn)
    torch.testing.assert_close(sh_to_rgb(sheared.sh, dirs @ t.T, 3), sh_to_rgb(g.sh, dirs, 3), atol=1e-10, rtol=0)
    [note] = placement_notes(g, SHEARED)
    assert "scales unevenly or shears" in note and "view-dependent colours" in note
    assert placement_notes(random_gaussians(5, sh_degree=0), SHEARED) == []  # no SH bands: nothing inexact


def test_the_placed_model_renders_as_the_model_seen_through_the_map():
    """The oracle needs no decomposition: the map folded into the camera's view matrix projects each model
    Gaussian exactly where the placed one is (means and covariances alike; SH degree 0)."""
    g = random_gaussians(300, seed=4, sh_degree=0, scale=0.06)
    g.opacity_logits = g.opacity_logits + 2.0
    for m in (SHEARED, affine(np.diag([0.8, -1.2, 1.1]) @ rotation([0.5, 0.2, 0.1], 0.6))):
        out = read_ply(encode_ply(affine_placed(g, m)))  # through the file, as an export goes
        viewmat = torch.from_numpy(CAMERA.w2c @ m).float()
        with torch.no_grad():
            ours = render(out, CAMERA, 0, (1.0, 1.0, 1.0)).image
            oracle = rasterizer_fn("reference")(g.means, g.quats, torch.exp(g.log_scales), g.opacities, g.sh, viewmat,
                                                torch.from_numpy(CAMERA.K).float(), CAMERA.width, CAMERA.height, 0,
                                                (1.0, 1.0, 1.0)).image
        assert (oracle < 0.9).any(-1).float().mean() > 0.2  # the model fills much of the view
        assert psnr(ours, oracle) >= 35.0, psnr(ours, oracle)


def test_convert_model_takes_any_invertible_map_and_export_ply_one_scale():
    ply = encode_ply(random_gaussians(20, seed=1, sh_degree=1))
    spec = protocol.REQUESTS["convert_model"].fields
    spec.check({"name": "a.ply", "placement": SHEARED.tolist()})
    with pytest.raises(ValueError, match="flattens"):
        spec.check({"name": "a.ply", "placement": affine(np.diag([1.0, 0.0, 1.0])).tolist()})
    with pytest.raises(ValueError, match="unevenly"):
        protocol.REQUESTS["export_ply"].fields.check({"name": "a.ply", "placement": SHEARED.tolist()})
    fields, data = convert(ply, "a.ply", SHEARED)
    assert fields["gaussians"] == 20 and "scales unevenly or shears" in fields["note"]
    np.testing.assert_allclose(read_ply(data).means.numpy(), read_ply(ply).means.numpy() @ SHEARED[:3, :3].T
                               + SHEARED[:3, 3], atol=1e-6)

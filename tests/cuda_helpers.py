"""The GPU tests' shared part: their marks, tolerances (test_cuda_rasterizer.py says why these), random scenes in
view of a random camera, and the pixels where the CUDA rasterizer and the reference may rightly disagree."""
from __future__ import annotations

import os

import pytest
import torch

from backend.render import reference
from backend.render.constants import ALPHA_MIN, RADIUS_SIGMAS, TILE

# A GPU test needs a CUDA GPU, and runs with the kernels' outputs NaN-poisoned (conftest's poisoned_kernels).
GPU_TEST = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (torch sees none); run on a GPU machine such as the H200"),
    pytest.mark.usefixtures("poisoned_kernels"),
]
DEV = "cuda"
IMAGE_TOL = 1e-4
GRAD_TOL = 1e-3
AMBIGUOUS_REL = 1e-5


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def look_camera(width, height, gen, fx=None):
    """World-to-camera matrix of a camera 6 units from the origin, looking at it from a random direction."""
    fx = fx or 0.9 * max(width, height)
    K = torch.tensor([[fx, 0, width / 2 + 1.5], [0, fx * 1.05, height / 2 - 2.0], [0, 0, 1]])
    axis = torch.randn(3, generator=gen)
    skew = torch.tensor([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    R = torch.linalg.matrix_exp(0.5 * skew)
    viewmat = torch.eye(4)
    viewmat[:3, :3] = R
    viewmat[:3, 3] = torch.tensor([0.2, -0.1, 6.0])
    return viewmat, K


def to_world(points_cam, viewmat):
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    return (points_cam - t) @ R


def random_scene(n, width, height, gen, *, scale=0.05, z_range=(3.0, 9.0), opacity=None, sh_coeffs=16):
    """Gaussians spread over (and a little beyond) the view of a random camera."""
    viewmat, K = look_camera(width, height, gen)
    z = z_range[0] + (z_range[1] - z_range[0]) * torch.rand(n, generator=gen)
    u = (torch.rand(n, generator=gen) * 1.3 - 0.15) * width
    v = (torch.rand(n, generator=gen) * 1.3 - 0.15) * height
    cam = torch.stack([(u - K[0, 2]) / K[0, 0] * z, (v - K[1, 2]) / K[1, 1] * z, z], dim=-1)
    scene = {
        "means": to_world(cam, viewmat),
        "quats": torch.randn(n, 4, generator=gen),
        "scales": scale * torch.exp(0.5 * torch.randn(n, 3, generator=gen)),
        "opacities": torch.sigmoid(1.5 * torch.randn(n, generator=gen)) if opacity is None
        else torch.full((n,), float(opacity)),
        "sh": 0.3 * torch.randn(n, sh_coeffs, 3, generator=gen),
        "viewmat": viewmat,
        "K": K,
    }
    scene["sh"][:, 0] = torch.randn(n, 3, generator=gen)
    return scene


def ambiguous_pixels(scene, width, height, sh_degree):
    """Pixels where some splat of the tile's list has alpha within AMBIGUOUS_REL of the 1/255 floor, or the
    pixel within AMBIGUOUS_REL of the splat's RADIUS_SIGMAS edge."""
    s = {k: v.to(DEV) for k, v in scene.items()}
    with torch.no_grad():
        proj = reference.project(s["means"], s["quats"], s["scales"], s["opacities"], s["sh"], s["viewmat"], s["K"],
                                 width, height, sh_degree)
        tile_ids, gauss_ids = reference.bin_tiles(proj, s["opacities"], width, height)
        tiles_x, tiles_y = (width + TILE - 1) // TILE, (height + TILE - 1) // TILE
        flags = torch.zeros(tiles_y * tiles_x, TILE * TILE, dtype=torch.int32, device=DEV)
        offsets = torch.arange(TILE, device=DEV, dtype=torch.float32) + 0.5
        py_local, px_local = torch.meshgrid(offsets, offsets, indexing="ij")
        for c0 in range(0, len(gauss_ids), 4096):
            tid, gid = tile_ids[c0:c0 + 4096], gauss_ids[c0:c0 + 4096]
            px = (tid % tiles_x * TILE).float()[:, None] + px_local.reshape(-1)
            py = (tid // tiles_x * TILE).float()[:, None] + py_local.reshape(-1)
            dx, dy = px - proj.means2d[gid, 0, None], py - proj.means2d[gid, 1, None]
            a, b, c = proj.conics[gid].unbind(-1)
            power = -0.5 * (a[:, None] * dx * dx + c[:, None] * dy * dy) - b[:, None] * dx * dy
            alpha = s["opacities"][gid, None] * torch.exp(power)
            edge = 0.5 * RADIUS_SIGMAS ** 2
            near = (alpha - ALPHA_MIN).abs() <= AMBIGUOUS_REL * ALPHA_MIN
            near |= (power + edge).abs() <= AMBIGUOUS_REL * edge
            flags.index_add_(0, tid, near.int())
        img = (flags > 0).reshape(tiles_y, tiles_x, TILE, TILE).permute(0, 2, 1, 3).reshape(tiles_y * TILE, tiles_x * TILE)
    return img[:height, :width]


def rel_l2(ours, ref):
    denom = ref.norm()
    if denom == 0:
        return ours.norm().item()
    return ((ours - ref).norm() / denom).item()

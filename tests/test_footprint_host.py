"""The binning kernels' footprint tiles (cuda/projection.cuh, compiled for the host without fused
multiply-adds) are the reference's bin_tiles entries, on random splats (thin, opaque, faint, at the image's
edges) and a trained model's. On a GPU the same code contracts to fused multiply-adds, which may move a tile at
the footprint's widened edge, never one holding a drawn pixel; the GPU tests compare images there."""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from backend.formats.ply import read_ply
from backend.render import camera_tensors, reference
from helpers import build_host_check, needs_host_cxx, orbit_cameras, random_gaussians

SHARED_PLY = Path(__file__).resolve().parents[2] / "shared" / "data" / "splats" / "donut_sh0.ply"
pytestmark = needs_host_cxx


@pytest.fixture(scope="module")
def footprint_host(tmp_path_factory):
    return build_host_check("footprint_host.cpp", tmp_path_factory.mktemp("footprint"))


def host_entries(exe: Path, proj, opacities, width: int, height: int, folder: Path) -> set[tuple[int, int]]:
    splats = torch.cat([proj.means2d, proj.conics, opacities.reshape(-1, 1), proj.radii.float().reshape(-1, 1)], 1)
    with open(folder / "splats.bin", "wb") as f:
        np.array([len(splats), width, height], np.int32).tofile(f)
        splats.float().numpy().tofile(f)
    subprocess.run([str(exe), str(folder / "splats.bin"), str(folder / "entries.bin")], check=True)
    pairs = np.fromfile(folder / "entries.bin", np.int32).reshape(-1, 2)
    entries = set(map(tuple, pairs.tolist()))
    assert len(entries) == len(pairs), "a tile listed twice for one splat"
    return entries


def check(exe, g, cam, folder):
    viewmat, K = camera_tensors(cam, "cpu")
    opacities = torch.sigmoid(g.opacity_logits)
    with torch.no_grad():
        proj = reference.project(g.means, g.quats, torch.exp(g.log_scales), opacities, g.sh[:, :1], viewmat, K,
                                 cam.width, cam.height, 0)
        ref = reference.bin_tiles(proj, opacities, cam.width, cam.height)
    expected = set(zip(ref.gauss_ids.tolist(), ref.tile_ids.tolist()))
    assert host_entries(exe, proj, opacities, cam.width, cam.height, folder) == expected
    return len(expected)


@pytest.mark.parametrize("seed, width, height", [(0, 160, 96), (1, 333, 201)])
def test_random_splats(footprint_host, tmp_path, seed, width, height):
    g = random_gaussians(2000, seed=seed, sh_degree=0, scale=0.05)
    gen = torch.Generator().manual_seed(seed)
    g.log_scales[:500, 0] += 2.0  # long and thin
    g.log_scales[500:600] -= 3.0  # below a pixel
    g.opacity_logits = 4 * torch.randn(len(g), generator=gen)  # from faint to opaque
    assert check(footprint_host, g, orbit_cameras(1, width, height, radius=1.6)[0], tmp_path) > 2000


@pytest.mark.skipif(not SHARED_PLY.is_file(), reason=f"needs the shared third-party PLY {SHARED_PLY}")
def test_a_trained_model(footprint_host, tmp_path):
    g = read_ply(SHARED_PLY)
    center = g.means.mean(0)
    extent = float((g.means - center).norm(dim=1).quantile(0.9))
    g.means = (g.means - center) / extent
    g.log_scales = g.log_scales - math.log(extent)
    assert check(footprint_host, g, orbit_cameras(3, 640, 360, radius=2.2)[1], tmp_path) > 100_000

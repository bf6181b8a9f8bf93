"""Blender's formation's projection in the kernels (cuda/rays.cuh, compiled for the host) against the reference's
project_rays and its autograd (float64): the projected centres, ray parameters, opacities as drawn, footprint
rectangles and radii, and the gradients w.r.t. means, quats, scales and opacities, on random splats (flat ones,
ones of a pixel or less, whose film widening matters, ones at the image's edges, behind the camera and crossing
the near plane among them)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

from backend.render import camera_tensors, reference

from helpers import build_host_check, needs_host_cxx, orbit_cameras, random_gaussians, ray_parameters

RAY_PARAMS = 10

pytestmark = needs_host_cxx


@pytest.fixture(scope="module")
def rays_host(tmp_path_factory):
    return build_host_check("rays_host.cpp", tmp_path_factory.mktemp("rays"))


def reference_side(g, viewmat, K, width, height, upstream):
    """The reference's outputs, and its gradients w.r.t. means, quats, scales and opacities of the loss
    sum(upstream * outputs) over (means2d, ray parameters, opacities as drawn)."""
    params = [t.detach().clone().requires_grad_() for t in (g.means, g.quats, torch.exp(g.log_scales), g.opacities)]
    proj = reference.project_rays(*params, g.sh, viewmat, K, width, height, 0)
    rays = ray_parameters(proj)
    outputs = torch.cat([proj.means2d, rays, proj.opacities[:, None]], dim=1)
    (outputs * upstream).sum().backward()
    rects = torch.stack(proj.rects, dim=-1)
    return outputs.detach(), rects, proj.radii, [p.grad for p in params], rays.detach()


@pytest.mark.parametrize("seed, width, height, scale", [(0, 96, 64, 0.12), (1, 131, 77, 0.006)])
def test_the_kernels_projection_is_the_references(rays_host, tmp_path, seed, width, height, scale):
    g = random_gaussians(400, seed=seed, sh_degree=0, scale=scale).to(dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    g.log_scales[:100, 2] -= 4.0  # flat
    g.log_scales[100:120] += 1.5  # large: some reach the near plane
    g.opacity_logits = 2 * torch.randn(len(g), generator=gen, dtype=torch.float64)
    cam = orbit_cameras(1, width, height, radius=1.8)[0]
    viewmat, K = camera_tensors(cam, "cpu", torch.float64)
    upstream = torch.randn(len(g), 2 + RAY_PARAMS + 1, generator=gen, dtype=torch.float64)
    expected, rects, radii, grads, rays = reference_side(g, viewmat, K, width, height, upstream)
    # The kernels' means2d gradient holds the part through the rays' centre m (raster.cuh's Rays::store).
    depth = 1 / rays[:, 3]
    folded = upstream[:, :2] + depth[:, None] * torch.stack(
        [(upstream[:, 2:5] * rays[:, 4:7]).sum(-1), (upstream[:, 2:5] * rays[:, 7:10]).sum(-1)], dim=-1)
    rows = torch.cat([g.means, g.quats, torch.exp(g.log_scales), g.opacities[:, None], folded, upstream[:, 2:]], 1)
    with open(tmp_path / "in.bin", "wb") as f:
        np.array([len(g), width, height], np.int32).tofile(f)
        torch.cat([viewmat.reshape(-1), K.reshape(-1)]).float().numpy().tofile(f)
        rows.float().numpy().tofile(f)
    subprocess.run([str(rays_host), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    out = torch.from_numpy(np.fromfile(tmp_path / "out.bin", np.float32).reshape(len(g), -1)).double()

    host_radii = out[:, 7 + RAY_PARAMS].int()
    drawn = radii > 0
    assert 200 < int(drawn.sum()) < len(g) and bool((host_radii == radii).float().mean() > 0.99)
    both = drawn & (host_radii > 0)
    torch.testing.assert_close(out[both, :3 + RAY_PARAMS], expected[both], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out[both, 3 + RAY_PARAMS:7 + RAY_PARAMS], rects[both], rtol=1e-4, atol=1e-3)
    host_grads = (out[:, 8 + RAY_PARAMS:11 + RAY_PARAMS], out[:, 11 + RAY_PARAMS:15 + RAY_PARAMS],
                  out[:, 15 + RAY_PARAMS:18 + RAY_PARAMS], out[:, 18 + RAY_PARAMS])
    for name, ours, ref in zip(("means", "quats", "scales", "opacities"), host_grads, grads):
        ours, ref = ours[both], ref[both]
        assert float((ours - ref).norm() / ref.norm()) < 1e-4, name

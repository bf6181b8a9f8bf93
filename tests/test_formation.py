"""The blender image formation (backend/render/formation.py) of the reference rasterizer: against a per-pixel walk
written Cycles' way from first principles and closed forms of linear-light blending (its gradients against finite
differences: test_reference_renderer.py's gradcheck)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from blender_addon.core.cameras import Camera, intrinsics, look_at
from backend.gaussians import Gaussians, logit, rgb_to_sh_dc
from backend.render import camera_tensors, reference, render
from backend.render.constants import ALPHA_MAX, ALPHA_MIN, NEAR_PLANE, RADIUS_SIGMAS, T_STOP, TILE
from backend.render.formation import (FILM_SPLAT_VARIANCE, FILM_TAPS, SCALE_CLAMP, blackman_harris,
                                      linear_to_srgb, srgb_to_linear)
from backend.sh import sh_basis
from helpers import orbit_cameras, random_gaussians, ray_parameters


def decode(c):
    return np.where(c <= 0.04045, c / 12.92, ((np.maximum(c, 0.04045) + 0.055) / 1.055) ** 2.4)


def encode(x):
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.maximum(x, 0.0031308) ** (1 / 2.4) - 0.055)


def quat_matrix(q):
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def ray_walk(g: Gaussians, cam: Camera, sh_degree: int, background):
    """Per pixel, each splat as Cycles evaluates it (gsplat_intersect.h): scales clamped to SCALE_CLAMP of the
    largest, covariance S = R diag(s^2) R^T widened by the film filter's share (FILM_SPLAT_VARIANCE px^2 at its
    depth, its opacity lowered by the growth of its projected area), at the point x = t d of the pixel's ray where
    its response peaks, t = d^T S^-1 mu / d^T S^-1 d, alpha = opacity exp(-(x - mu)^T S^-1 (x - mu) / 2); the
    pixel's splats in the order of t along the ray through its tile's pixel nearest to the splat's projected
    centre (at least 0; then by index), their sRGB colours decoded and blended in linear light over the
    background's linear colour (the alpha floor and cap, the footprint bound and the stop rule as in the standard
    formation); then the film's taps (edges repeated) and the sRGB encoding."""
    w2c = cam.w2c
    R, t = w2c[:3, :3], w2c[:3, 3]
    fx, fy, cx, cy = cam.K[0, 0], cam.K[1, 1], cam.K[0, 2], cam.K[1, 2]
    means = g.means.detach().double().numpy()
    scales = np.exp(g.log_scales.detach().double().numpy())
    quats = g.quats.detach().double().numpy()
    opac = torch.sigmoid(g.opacity_logits.detach().double()).numpy()
    sh = g.sh.detach().double()
    p = means @ R.T + t
    campos = -R.T @ t
    dirs = torch.nn.functional.normalize(torch.tensor(means - campos), dim=-1)
    k = (sh_degree + 1) ** 2
    colors = decode(np.maximum((sh_basis(dirs, sh_degree)[:, :, None] * sh[:, :k]).sum(1).numpy() + 0.5, 0))
    inv, drawn_opac = [], []
    for i in range(len(means)):
        s = np.maximum(scales[i], SCALE_CLAMP * scales[i].max())
        rot = R @ quat_matrix(quats[i])
        x, y, z = p[i]
        spread = FILM_SPLAT_VARIANCE * z * z / (fx * fy)
        cov = rot @ np.diag(s * s) @ rot.T
        wide = cov + spread * np.eye(3)
        J = np.array([[fx / z, 0, -fx * x / z ** 2], [0, fy / z, -fy * y / z ** 2]])
        drawn_opac.append(opac[i] * math.sqrt(np.linalg.det(J @ cov @ J.T) / np.linalg.det(J @ wide @ J.T)))
        inv.append(np.linalg.inv(wide))
    inv, drawn_opac = np.array(inv), np.array(drawn_opac)
    centres = np.stack([fx * p[:, 0] / p[:, 2] + cx, fy * p[:, 1] / p[:, 2] + cy], axis=-1)  # projected, in pixels
    bg = decode(np.asarray(background, dtype=np.float64))
    out = np.zeros((cam.height, cam.width, 4))
    for py in range(cam.height):
        for px in range(cam.width):
            d = np.array([(px + 0.5 - cx) / fx, (py + 0.5 - cy) / fy, 1.0])
            q = np.einsum("j,njk,k->n", d, inv, d)
            tmax = np.einsum("j,njk,nk->n", d, inv, p) / q
            tile_lo = np.array([px // TILE * TILE, py // TILE * TILE]) + 0.5
            nearest = np.clip(centres, tile_lo, tile_lo + TILE - 1)  # the tile's pixel nearest to each centre
            rays = np.stack([(nearest[:, 0] - cx) / fx, (nearest[:, 1] - cy) / fy, np.ones(len(p))], axis=-1)
            order_key = np.maximum(np.einsum("nj,njk,nk->n", rays, inv, p)
                                   / np.einsum("nj,njk,nk->n", rays, inv, rays), 0)
            off = tmax[:, None] * d - p
            dist = np.einsum("nj,njk,nk->n", off, inv, off)
            alpha = np.minimum(ALPHA_MAX, drawn_opac * np.exp(-0.5 * dist))
            drawn = (dist <= RADIUS_SIGMAS ** 2) & (alpha >= ALPHA_MIN) & (tmax > NEAR_PLANE) & (p[:, 2] > NEAR_PLANE)
            T, color = 1.0, np.zeros(3)
            for i in sorted(np.nonzero(drawn)[0], key=lambda i: (order_key[i], i)):
                if T * (1 - alpha[i]) < T_STOP:
                    break
                color += colors[i] * alpha[i] * T
                T *= 1 - alpha[i]
            out[py, px, :3], out[py, px, 3] = color + T * bg, 1 - T
    taps = np.array(FILM_TAPS)
    padded = np.pad(out, ((0, 0), (1, 1), (0, 0)), mode="edge")
    out = sum(taps[j] * padded[:, j:j + cam.width] for j in range(3))
    padded = np.pad(out, ((1, 1), (0, 0), (0, 0)), mode="edge")
    out = sum(taps[j] * padded[j:j + cam.height] for j in range(3))
    return encode(out[..., :3]), out[..., 3]


def args(g, cam, sh_degree, background):
    viewmat, K = camera_tensors(cam, "cpu", g.means.dtype)
    return (g.means, g.quats, torch.exp(g.log_scales), g.opacities, g.sh, viewmat, K, cam.width, cam.height,
            sh_degree, background)


@pytest.mark.parametrize("n, width, height, seed", [(60, 37, 21, 0), (150, 33, 40, 1)])
def test_matches_the_per_pixel_ray_walk(n, width, height, seed):
    g = random_gaussians(n, seed=seed, sh_degree=2, scale=0.12).to(dtype=torch.float64)
    g.opacity_logits = g.opacity_logits + 2.0  # opaque enough that some pixels reach the stop rule
    g.log_scales[: n // 4, 0] -= 4.0  # flat splats crossing others: the order changes within their footprints
    cam = orbit_cameras(1, width, height, radius=2.5)[0]
    expected_image, expected_alpha = ray_walk(g, cam, 2, (0.2, 0.5, 0.9))
    out = reference.rasterize(*args(g, cam, 2, (0.2, 0.5, 0.9)), formation="blender")
    np.testing.assert_allclose(out.image.numpy(), expected_image, atol=1e-9)
    np.testing.assert_allclose(out.alpha.numpy(), expected_alpha, atol=1e-9)


def two_splats(front_opacity: float) -> tuple[Gaussians, Camera]:
    """Red in front of opaque green, both wide (a 20 px deviation), the camera looking at their centres."""
    colors = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    g = Gaussians(means=torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, -1.0]], dtype=torch.float64),
                  log_scales=torch.log(torch.tensor([[0.25] * 3, [0.3125] * 3], dtype=torch.float64)),
                  quats=torch.tensor([[1.0, 0, 0, 0]] * 2, dtype=torch.float64),
                  opacity_logits=logit(torch.tensor([front_opacity, 0.9999], dtype=torch.float64)),
                  sh_dc=rgb_to_sh_dc(colors)[:, None], sh_rest=torch.zeros(2, 0, 3, dtype=torch.float64))
    cam = Camera(look_at([0, 0, 4.0], [0, 0, 0], up=(0, 1, 0)), intrinsics(320.0, 320.0, 16, 16), 32, 32)
    return g, cam


@pytest.mark.parametrize("opacity", [0.25, 0.5, 0.75])
def test_half_red_over_green_mixes_in_linear_light(opacity):
    """Where both splats peak, the standard formation mixes the display values, a of red and (1 - a) of green;
    Blender's mixes their linear values and shows the mix's sRGB, which is brighter: at a = 0.5, 0.735 each where
    the standard formation shows 0.5 (Blender 5.3's Cycles measured 0.753, 0.741 on its own scene)."""
    g, cam = two_splats(opacity)
    with torch.no_grad():
        standard = render(g, cam, 0, (0.0, 0.0, 0.0)).image[16, 16]
        blender = render(g, cam, 0, (0.0, 0.0, 0.0), formation="blender").image[16, 16]
    green = ALPHA_MAX * (1 - opacity)  # the green one capped
    torch.testing.assert_close(standard, torch.tensor([opacity, green, 0.0], dtype=torch.float64), atol=2e-3, rtol=0)
    expected = linear_to_srgb(torch.tensor([opacity, green, 0.0], dtype=torch.float64))
    torch.testing.assert_close(blender, expected, atol=2e-3, rtol=0)


def test_srgb_transfer_functions_invert_each_other_and_meet_the_standard():
    x = torch.linspace(0, 1, 1001, dtype=torch.float64)
    torch.testing.assert_close(linear_to_srgb(srgb_to_linear(x)), x, atol=1e-12, rtol=0)
    assert float(srgb_to_linear(torch.tensor(0.5))) == pytest.approx(0.21404, abs=1e-5)
    assert float(linear_to_srgb(torch.tensor(0.5))) == pytest.approx(0.73536, abs=1e-5)


def test_the_film_filter_parts_make_cycles_blackman_harris():
    """Cycles spreads its Blackman-Harris of width 1.5 over 3 px (film.cpp): 0.42 px deviation. The taps at whole
    pixels and the splats' share add up to its variance."""
    xs = torch.linspace(-1.5, 1.5, 3001, dtype=torch.float64)
    w = blackman_harris(xs, 1.5)
    variance = float((w * xs * xs).sum() / w.sum())
    assert math.sqrt(variance) == pytest.approx(0.4155, abs=1e-3)
    assert sum(FILM_TAPS) == pytest.approx(1.0)
    assert 2 * FILM_TAPS[0] + FILM_SPLAT_VARIANCE == pytest.approx(variance, rel=1e-4)
    assert float(blackman_harris(torch.tensor(1.5), 1.5)) == 0.0


def test_every_pixel_a_splat_reaches_is_in_its_tiles(monkeypatch):
    """The footprint boxes (the silhouettes' bounds) list every tile a splat draws on: with whole-image boxes the
    image is the same, from more entries."""
    g = random_gaussians(120, seed=4, sh_degree=1, scale=0.1).to(dtype=torch.float64)
    g.log_scales[:, 1] += 1.0  # long and thin, turned every way
    cam = orbit_cameras(1, 48, 40, radius=2.0)[0]
    a = args(g, cam, 1, (0.0, 0.0, 0.0))
    with torch.no_grad():
        tight = reference.rasterize(*a, formation="blender")
        entries = len(reference.bin_rects(reference.project_rays(*a[:10]), 48, 40).tile_ids)
        monkeypatch.setattr(reference, "silhouette_bounds", lambda *s: tuple(
            torch.full((len(s[0]),), v, dtype=torch.float64) for v in (0.0, 48.0, 0.0, 40.0)))
        whole = reference.rasterize(*a, formation="blender")
        all_entries = len(reference.bin_rects(reference.project_rays(*a[:10]), 48, 40).tile_ids)
    assert entries < 0.7 * all_entries
    torch.testing.assert_close(tight.image, whole.image, rtol=0, atol=1e-12)


def test_a_flat_splat_seen_edge_on_stays_finite():
    """A splat with a zero scale is clamped to 1e-3 of its largest, as Cycles clamps it: seen edge-on, a line far
    thinner than a pixel, which the film filter draws as a faint one (its weight kept, not its opacity)."""
    g = random_gaussians(1, seed=0, sh_degree=0).to(dtype=torch.float64)
    g.means = torch.zeros(1, 3, dtype=torch.float64)
    g.quats = torch.tensor([[1.0, 0, 0, 0]], dtype=torch.float64)
    g.log_scales = torch.log(torch.tensor([[0.3, 0.3, 1e-12]], dtype=torch.float64))
    g.opacity_logits = torch.tensor([4.0], dtype=torch.float64)
    cam = Camera(look_at([3.0, 0, 0], [0, 0, 0], up=(0, 0, 1)), intrinsics(40.0, 40.0, 16.5, 16.5), 32, 32)
    out = reference.rasterize(*args(g, cam, 0, (1.0, 1.0, 1.0)), formation="blender")
    assert torch.isfinite(out.image).all() and 0 < float(out.alpha.max()) < 0.05


def test_means2d_receive_the_screen_space_gradient():
    """Densification reads dL/d(means2d): the blender formation evaluates its rays through the projected means,
    so moving one on the screen is what the gradient says."""
    g = random_gaussians(20, seed=2, sh_degree=0, scale=0.15).to(dtype=torch.float64)
    cam = orbit_cameras(1, 24, 24)[0]
    a = list(args(g.requires_grad_(), cam, 0, (1.0, 1.0, 1.0)))
    out = reference.rasterize(*a, formation="blender")
    out.image.sum().backward()
    grad = out.means2d.grad
    assert grad is not None and bool((grad.abs().sum(-1) > 0).sum() > 10)


def test_the_kernels_ray_parameters_give_the_reference_distances_and_depths():
    """The CUDA kernels evaluate a splat along a pixel's ray from its ray parameters (helpers.ray_parameters,
    cuda/rays.cuh's, cuda/raster.cuh's Rays): r = s m + du N0 + dv N1 for the pixel's offset (du, dv) from the
    projected centre, the squared distance |m x (du N0 + dv N1)|^2 / |r|^2 and the depth m.r / |r|^2. Those are
    the reference's, which evaluates the ray through the pixel in the splat's frame."""
    g = random_gaussians(40, seed=5, sh_degree=0, scale=0.2).to(dtype=torch.float64)
    g.log_scales[:10, 2] -= 3.0  # flat ones too
    cam = orbit_cameras(1, 40, 30, radius=2.5)[0]
    proj = reference.project_rays(*args(g, cam, 0, (0.0, 0.0, 0.0))[:10])
    drawn = (proj.radii > 0).nonzero().squeeze(1)
    px = torch.rand(len(drawn), 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 40
    py = torch.rand(len(drawn), 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 30
    ray, m = reference.splat_rays(proj, drawn, px, py)
    ray_sq = (ray * ray).sum(-1)
    expected_dist = (torch.linalg.cross(m.expand_as(ray), ray, dim=-1) ** 2).sum(-1) / ray_sq
    expected_depth = (m * ray).sum(-1) / ray_sq

    params = ray_parameters(proj)[drawn]
    m, s, n0, n1 = params[:, None, :3], params[:, None, 3:4], params[:, None, 4:7], params[:, None, 7:10]
    du = (px - proj.means2d[drawn, 0, None])[..., None]
    dv = (py - proj.means2d[drawn, 1, None])[..., None]
    v = du * n0 + dv * n1
    r = s * m + v
    r_sq = (r * r).sum(-1)
    torch.testing.assert_close((torch.linalg.cross(m.expand_as(v), v, dim=-1) ** 2).sum(-1) / r_sq, expected_dist)
    torch.testing.assert_close((m * r).sum(-1) / r_sq, expected_depth)

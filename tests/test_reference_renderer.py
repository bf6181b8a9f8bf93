"""The reference rasterizer against a per-pixel sequential loop (the kernel's semantics written the
slow, obvious way), its projection against closed forms, and its gradients against finite differences."""
import math

import numpy as np
import pytest
import torch

from blender_addon.core.cameras import Camera, intrinsics, look_at
from backend.render import camera_tensors, reference
from backend.render.constants import ALPHA_MAX, ALPHA_MIN, RADIUS_SIGMAS, T_STOP, TILE
from backend.sh import rotate_sh, sh_basis
from helpers import orbit_cameras, random_gaussians


def sequential_oracle(g, cam, sh_degree, background):
    """Per pixel: walk every splat in (depth, index) order, drawing those whose footprint (alpha >= 1/255, at
    most RADIUS_SIGMAS deviations out) holds the pixel: no tiles, so it also checks that binning lists every
    tile a footprint reaches."""
    viewmat, K = camera_tensors(cam, "cpu", torch.float64)
    g64 = g.to(dtype=torch.float64)
    proj = reference.project(g64.means, g64.quats, torch.exp(g64.log_scales), g64.opacities, g64.sh, viewmat, K,
                             cam.width, cam.height, sh_degree)
    opac = torch.sigmoid(g64.opacity_logits)
    order = sorted((float(np.float32(proj.depths[i])), i) for i in range(len(g)) if proj.radii[i] > 0)
    image = np.zeros((cam.height, cam.width, 3))
    alpha_out = np.zeros((cam.height, cam.width))
    for py in range(cam.height):
        for px in range(cam.width):
            T, color = 1.0, np.zeros(3)
            for _, i in order:
                dx, dy = px + 0.5 - float(proj.means2d[i, 0]), py + 0.5 - float(proj.means2d[i, 1])
                a, b, c = proj.conics[i].tolist()
                power = -0.5 * (a * dx * dx + c * dy * dy) - b * dx * dy
                if power > 0 or power < -0.5 * RADIUS_SIGMAS ** 2:
                    continue
                alpha = min(ALPHA_MAX, float(opac[i]) * math.exp(power))
                if alpha < ALPHA_MIN:
                    continue
                if T * (1 - alpha) < T_STOP:
                    break
                color += proj.colors[i].numpy() * alpha * T
                T *= 1 - alpha
            image[py, px] = color + T * np.asarray(background)
            alpha_out[py, px] = 1 - T
    return image, alpha_out


@pytest.mark.parametrize("n, width, height, seed", [(60, 37, 21, 0), (150, 33, 40, 1)])
def test_matches_the_sequential_per_pixel_walk(n, width, height, seed):
    g = random_gaussians(n, seed=seed, sh_degree=2, scale=0.12)
    g.opacity_logits = g.opacity_logits + 2.0  # opaque enough that some pixels reach the stop rule
    cam = orbit_cameras(1, width, height, radius=2.5)[0]
    expected_image, expected_alpha = sequential_oracle(g, cam, 2, (0.2, 0.5, 0.9))
    out = reference.rasterize(*_args(g.to(dtype=torch.float64), cam, 2, (0.2, 0.5, 0.9)))
    np.testing.assert_allclose(out.image.numpy(), expected_image, atol=1e-9)
    np.testing.assert_allclose(out.alpha.numpy(), expected_alpha, atol=1e-9)
    assert (expected_alpha > 1 - 1e-3).any(), "scene should exercise the transmittance stop"


def test_chunking_does_not_change_the_result(monkeypatch):
    g = random_gaussians(400, seed=3)
    cam = orbit_cameras(1, 70, 50)[0]
    whole = reference.rasterize(*_args(g, cam, 3, (1.0, 1.0, 1.0)))
    monkeypatch.setattr(reference, "MAX_CHUNK_PIXEL_ENTRIES", 256 * 40)
    chunked = reference.rasterize(*_args(g, cam, 3, (1.0, 1.0, 1.0)))
    torch.testing.assert_close(chunked.image, whole.image, atol=1e-6, rtol=0)
    torch.testing.assert_close(chunked.depth, whole.depth, atol=1e-5, rtol=0)


def test_projection_of_an_isotropic_gaussian_on_the_axis():
    f, z, s = 100.0, 4.0, 0.1
    cam = Camera(look_at([0, 0, z], [0, 0, 0], up=(0, 1, 0)), intrinsics(f, f, 32, 24), 64, 48)
    viewmat, K = camera_tensors(cam, "cpu", torch.float64)
    means = torch.zeros(1, 3, dtype=torch.float64)
    quats = torch.tensor([[1.0, 0, 0, 0]], dtype=torch.float64)
    scales = torch.full((1, 3), s, dtype=torch.float64)
    sh = torch.zeros(1, 1, 3, dtype=torch.float64)
    opaque = torch.ones(1, dtype=torch.float64)  # footprint of the full RADIUS_SIGMAS deviations
    proj = reference.project(means, quats, scales, opaque, sh, viewmat, K, 64, 48, 0)
    var = (f * s / z) ** 2 + 0.3
    torch.testing.assert_close(proj.means2d[0], torch.tensor([32.0, 24.0], dtype=torch.float64))
    torch.testing.assert_close(proj.conics[0], torch.tensor([1 / var, 0.0, 1 / var], dtype=torch.float64))
    assert proj.radii[0] == math.ceil(3 * math.sqrt(var))
    assert proj.depths[0] == pytest.approx(z)
    torch.testing.assert_close(proj.colors[0], torch.full((3,), 0.5, dtype=torch.float64))


def test_opacity_bounded_footprints_leave_the_image_unchanged():
    """Radii shrink where the opacity keeps alpha under the 1/255 floor sooner than RADIUS_SIGMAS deviations;
    compositing with the full radii gives the same image, with more tile entries."""
    g = random_gaussians(300, seed=11, sh_degree=1, scale=0.1).to(dtype=torch.float64)
    g.opacity_logits = 3 * g.opacity_logits - 2  # from far below the floor to nearly opaque
    cam = orbit_cameras(1, 48, 40)[0]
    means, quats, scales, opacities, sh, viewmat, K, w, h, deg, _ = _args(g, cam, 1, (0.0, 0.0, 0.0))
    with torch.no_grad():
        tight = reference.project(means, quats, scales, opacities, sh, viewmat, K, w, h, deg)
        full = reference.project(means, quats, scales, torch.ones_like(opacities), sh, viewmat, K, w, h, deg)
        images = [reference.composite(proj, *reference.bin_tiles(proj, opacities, w, h), opacities, w, h)[0]
                  for proj in (tight, full)]
    assert (tight.radii < full.radii).sum() > 50 and (tight.radii <= full.radii).all()
    assert ((tight.radii == 0) & (full.radii > 0)).any()  # below the floor everywhere: culled
    tight_entries = len(reference.bin_tiles(tight, opacities, w, h).tile_ids)
    assert tight_entries < len(reference.bin_tiles(full, torch.ones_like(opacities), w, h).tile_ids)
    torch.testing.assert_close(images[0], images[1], rtol=0, atol=1e-12)


def test_footprint_tiles_change_no_pixel():
    """Binning lists only the tiles a splat's footprint meets, a part of its square's tiles (about half here, for
    long thin splats), and the image is the one compositing every tile of the squares gives."""
    g = random_gaussians(200, seed=5, sh_degree=1, scale=0.06).to(dtype=torch.float64)
    g.log_scales[:, 0] += 1.5  # long and thin
    cam = orbit_cameras(1, 80, 64)[0]
    means, quats, scales, opacities, sh, viewmat, K, w, h, deg, _ = _args(g, cam, 1, (0.0, 0.0, 0.0))
    with torch.no_grad():
        proj = reference.project(means, quats, scales, opacities, sh, viewmat, K, w, h, deg)
        tiles, gauss = reference.bin_tiles(proj, opacities, w, h)
        x_lo, x_hi, y_lo, y_hi = reference.tile_rect(proj.means2d, proj.radii, w, h)
        tiles_x = (w + TILE - 1) // TILE
        square = [(int(y) * tiles_x + int(x), i) for i in (proj.radii > 0).nonzero().flatten().tolist()
                  for y in range(y_lo[i], y_hi[i]) for x in range(x_lo[i], x_hi[i])]
        listed = list(zip(tiles.tolist(), gauss.tolist()))
        assert len(set(listed)) == len(listed) and set(listed) <= set(square)
        assert len(listed) < 0.6 * len(square), (len(listed), len(square))
        depth = proj.depths.float()
        square.sort(key=lambda e: (e[0], float(depth[e[1]]), e[1]))
        square_tiles, square_gauss = (torch.tensor(c) for c in zip(*square))
        images = [reference.composite(proj, t, i, opacities, w, h)[0] for t, i in ((tiles, gauss),
                                                                                 (square_tiles, square_gauss))]
    torch.testing.assert_close(images[0], images[1], rtol=0, atol=1e-12)


def test_culls_behind_near_plane_and_off_screen():
    cam = orbit_cameras(1, 32, 32)[0]
    g = random_gaussians(3)
    eye = torch.tensor(cam.position, dtype=torch.float32)
    forward = torch.tensor(cam.c2w[:3, 2], dtype=torch.float32)
    right = torch.tensor(cam.c2w[:3, 0], dtype=torch.float32)
    g.means = torch.stack([eye - forward, eye + 0.005 * forward, eye + 2 * forward + 50 * right])
    out = reference.rasterize(*_args(g, cam, 0, (1.0, 1.0, 1.0)))
    assert out.radii.tolist() == [0, 0, 0]
    torch.testing.assert_close(out.image, torch.ones(32, 32, 3))


def test_outputs_alpha_and_depth():
    g = random_gaussians(200, seed=5)
    cam = orbit_cameras(1, 40, 40)[0]
    out = reference.rasterize(*_args(g, cam, 3, (0.0, 0.0, 0.0)))
    assert 0 <= out.alpha.min() and out.alpha.max() <= 1
    mean_depth = out.depth[out.alpha > 0.5] / out.alpha[out.alpha > 0.5]
    assert ((mean_depth > 1.5) & (mean_depth < 4.5)).all()  # the model sits about 3 m away


@pytest.mark.parametrize("formation", ["standard", "blender"])
def test_gradcheck_float64(formation):
    """Gradients to means, quaternions, scales, opacities and SH agree with finite differences, in both image
    formations."""
    g = random_gaussians(6, seed=7, sh_degree=3, scale=0.3).to(dtype=torch.float64)
    cam = orbit_cameras(1, 20, 18, radius=2.5)[0]
    viewmat, K = camera_tensors(cam, "cpu", torch.float64)
    weights = torch.rand(18, 20, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def f(means, quats, log_scales, opacity_logits, sh):
        out = reference.rasterize(means, quats, torch.exp(log_scales), torch.sigmoid(opacity_logits), sh,
                                  viewmat, K, 20, 18, 3, (0.3, 0.3, 0.3), formation)
        return (out.image * weights).sum()

    inputs = tuple(t.clone().requires_grad_() for t in
                   (g.means, g.quats, g.log_scales, g.opacity_logits, g.sh))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


def _args(g, cam, sh_degree, background):
    viewmat, K = camera_tensors(cam, "cpu", g.means.dtype)
    return (g.means, g.quats, torch.exp(g.log_scales), g.opacities, g.sh, viewmat, K,
            cam.width, cam.height, sh_degree, background)


def test_an_empty_view_still_backpropagates_zero():
    g = random_gaussians(5)
    cam = orbit_cameras(1, 16, 16)[0]
    behind = -100 * torch.tensor(cam.c2w[:3, 2], dtype=torch.float32)
    g.means = g.means + behind
    g.requires_grad_()
    out = reference.rasterize(*_args(g, cam, 0, (1.0, 1.0, 1.0)))
    out.image.sum().backward()
    assert torch.all(g.means.grad == 0)
    for name, t in g.tensors().items():  # every group gets a (zero) gradient, as the kernels give
        assert t.grad is not None and torch.all(t.grad == 0), name


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_turned_sh_coefficients_show_the_colour_of_the_turned_direction(degree):
    """rotate_sh: the turned coefficients seen along R d give the colour the old ones gave along d, every
    degree."""
    gen = torch.Generator().manual_seed(degree)
    sh = torch.randn(20, (degree + 1) ** 2, 3, generator=gen, dtype=torch.float64)
    axis = torch.nn.functional.normalize(torch.tensor([0.3, -1.0, 0.6], dtype=torch.float64), dim=0)
    k = torch.tensor([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]], dtype=torch.float64)
    rotation = torch.eye(3, dtype=torch.float64) + math.sin(1.1) * k + (1 - math.cos(1.1)) * k @ k
    turned = torch.cat([sh[:, :1], rotate_sh(sh[:, 1:], rotation)], dim=1)
    dirs = torch.nn.functional.normalize(torch.randn(20, 3, generator=gen, dtype=torch.float64), dim=-1)
    before = (sh_basis(dirs, degree)[:, :, None] * sh).sum(1)
    after = (sh_basis(dirs @ rotation.T, degree)[:, :, None] * turned).sum(1)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-10)


def test_depth_keys_keep_the_depth_order_within_their_bits():
    """Tile entries sort by (tile, depth key): the visible depths' float bits less the lowest, shifted to fit
    the bits a 32-bit key leaves beside the tile. The keys keep the depth order (ties only within a step),
    fit those bits, and keep every depth apart where the range fits unshifted; culled Gaussians do not widen
    the range."""
    gen = torch.Generator().manual_seed(0)
    depths = torch.cat([0.02 + 100 * torch.rand(10_000, generator=gen), torch.tensor([1e6, -3.0])])
    visible = depths > 0.01
    bits = reference.depth_key_bits(1920, 1080)
    assert bits == 32 - 13  # 120 x 68 tiles
    keys = reference.depth_keys(depths, visible, bits)[visible][torch.argsort(depths[visible])]
    assert int(keys[0]) == 0 and int(keys[-1]) < 2 ** bits
    assert bool((keys[1:] >= keys[:-1]).all())
    close = torch.tensor([1.0, 1.0000001, 1.0000002, -1e9])
    assert reference.depth_keys(close, close > 0, bits)[:3].tolist() == [0, 1, 2]
    assert reference.depth_key_bits(7680, 4320) == 32  # 480 x 270 tiles: 64-bit keys with the full depth bits

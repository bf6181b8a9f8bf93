"""The GPU tests' shared part: their marks, tolerances (test_cuda_rasterizer.py says why these), random scenes in
view of a random camera, and the pixels where the CUDA rasterizer and the reference may rightly disagree."""
from __future__ import annotations

import os

import pytest
import torch

from backend.render import reference
from backend.render.constants import ALPHA_MIN, NEAR_PLANE, RADIUS_SIGMAS, TILE

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


def _near_standard(s, proj, tid, gid, px, py):
    """Which (entry, pixel) pairs of the standard formation lie within rounding of the alpha floor or the
    footprint's edge."""
    dx, dy = px - proj.means2d[gid, 0, None], py - proj.means2d[gid, 1, None]
    a, b, c = proj.conics[gid].unbind(-1)
    power = -0.5 * (a[:, None] * dx * dx + c[:, None] * dy * dy) - b[:, None] * dx * dy
    alpha = s["opacities"][gid, None] * torch.exp(power)
    edge = 0.5 * RADIUS_SIGMAS ** 2
    near = (alpha - ALPHA_MIN).abs() <= AMBIGUOUS_REL * ALPHA_MIN
    return near | ((power + edge).abs() <= AMBIGUOUS_REL * edge)


def _near_blender(s, proj, tid, gid, px, py):
    """... of the blender formation: the alpha floor, the footprint's edge or the near plane."""
    ray, m = reference.splat_rays(proj, gid, px, py)
    ray_sq = (ray * ray).sum(-1)
    dist = (torch.linalg.cross(m.expand_as(ray), ray, dim=-1) ** 2).sum(-1) / ray_sq
    depth = (m * ray).sum(-1) / ray_sq
    alpha = proj.opacities[gid, None] * torch.exp(-0.5 * dist)
    near = (alpha - ALPHA_MIN).abs() <= AMBIGUOUS_REL * ALPHA_MIN
    near |= (dist - RADIUS_SIGMAS ** 2).abs() <= AMBIGUOUS_REL * RADIUS_SIGMAS ** 2
    return near | ((depth - NEAR_PLANE).abs() <= AMBIGUOUS_REL * depth.abs().clamp_min(1.0))


def ambiguous_pixels(scene, width, height, sh_degree, formation="standard"):
    """Pixels where some splat of the tile's list has alpha within AMBIGUOUS_REL of the 1/255 floor, or the
    pixel within AMBIGUOUS_REL of the splat's RADIUS_SIGMAS edge (or, in the blender formation, its maximum of the
    near plane). The blender formation's film filter mixes each into its neighbours: film_neighbours."""
    s = {k: v.to(DEV) for k, v in scene.items()}
    args = (s["means"], s["quats"], s["scales"], s["opacities"], s["sh"], s["viewmat"], s["K"], width, height,
            sh_degree)
    with torch.no_grad():
        if formation == "blender":
            proj = reference.project_rays(*args)
            tile_ids, gauss_ids = reference.bin_rects(proj, width, height)
            near_pairs = _near_blender
        else:
            proj = reference.project(*args)
            tile_ids, gauss_ids = reference.bin_tiles(proj, s["opacities"], width, height)
            near_pairs = _near_standard
        tiles_x, tiles_y = (width + TILE - 1) // TILE, (height + TILE - 1) // TILE
        flags = torch.zeros(tiles_y * tiles_x, TILE * TILE, dtype=torch.int32, device=DEV)
        offsets = torch.arange(TILE, device=DEV, dtype=torch.float32) + 0.5
        py_local, px_local = torch.meshgrid(offsets, offsets, indexing="ij")
        for c0 in range(0, len(gauss_ids), 4096):
            tid, gid = tile_ids[c0:c0 + 4096], gauss_ids[c0:c0 + 4096]
            px = (tid % tiles_x * TILE).float()[:, None] + px_local.reshape(-1)
            py = (tid // tiles_x * TILE).float()[:, None] + py_local.reshape(-1)
            flags.index_add_(0, tid, near_pairs(s, proj, tid, gid, px, py).int())
        img = (flags > 0).reshape(tiles_y, tiles_x, TILE, TILE).permute(0, 2, 1, 3)
        img = img.reshape(tiles_y * TILE, tiles_x * TILE)[:height, :width]
    return img


def film_neighbours(pixels):
    """The pixels the film filter mixes `pixels` (height, width bool) into: they and their 8 neighbours."""
    return torch.nn.functional.max_pool2d(pixels[None, None].float(), 3, stride=1, padding=1)[0, 0] > 0


PARAMS = ("means", "quats", "scales", "opacities", "sh")


def means2d_tolerance(scene, means2d):
    """1e-4 px and 1e-5 relative, widened by what float32 makes of each centre's view depth where it is a
    difference of larger terms (a camera 6 units from the origin, a Gaussian 0.05 in front of it): a few ulps of
    the terms, which moves the projection by that share of its distance from the principal point."""
    R, t = scene["viewmat"][:3, :3].to(DEV), scene["viewmat"][:3, 3].to(DEV)
    means = scene["means"].to(DEV)
    depth = means @ R[2] + t[2]
    rounding = 4 * torch.finfo(torch.float32).eps * ((means * R[2]).abs().sum(-1) + t[2].abs())
    off_centre = (means2d - scene["K"][:2, 2].to(DEV)).abs()
    return 1e-4 + 1e-5 * means2d.abs() + off_centre * (rounding / depth.abs().clamp_min(NEAR_PLANE))[:, None]


def render_both(scene, width, height, sh_degree, background, grad=True, keep=None, formation="standard"):
    """Both renders in an image formation and, with grad, both sides' gradients of a random weighting of image and
    alpha; `keep` (height, width bool) zeroes the weights elsewhere (ambiguous pixels, whose gradients differ by
    design)."""
    from backend.render import rasterizer_fn
    outs, grads = {}, {}
    for name in ("cuda", "reference"):
        fn = rasterizer_fn(name, formation)
        params = {k: scene[k].to(DEV).requires_grad_(grad) for k in PARAMS}
        out = fn(params["means"], params["quats"], params["scales"], params["opacities"], params["sh"],
                 scene["viewmat"].to(DEV), scene["K"].to(DEV), width, height, sh_degree,
                 torch.tensor(background, device=DEV))
        outs[name] = out
        if grad:
            gen = torch.Generator(device=DEV).manual_seed(1234)
            w_img = torch.randn(out.image.shape, generator=gen, device=DEV)
            w_alpha = torch.randn(out.alpha.shape, generator=gen, device=DEV)
            if keep is not None:
                w_img, w_alpha = w_img * keep[..., None], w_alpha * keep
            loss = (out.image * w_img).sum() + (out.alpha * w_alpha).sum()
            if name == "cuda" or loss.requires_grad:  # the reference's graph is cut where no splat reaches a pixel
                loss.backward()
            grads[name] = {k: params[k].grad for k in PARAMS}
            grads[name]["means2d"] = out.means2d.grad
            if name == "reference":
                grads[name] = {k: g if g is not None else torch.zeros_like(grads["cuda"][k])
                               for k, g in grads[name].items()}
    return outs, grads


def check_against_reference(scene, width, height, sh_degree=3, background=(0.1, 0.5, 0.9), seed=None,
                            max_ambiguous=1e-3, formation="standard"):
    """`max_ambiguous`: the largest fraction of the image's pixels that may be ambiguous (in the blender
    formation, before the film filter spreads them to their neighbours, which are left out of the comparison too)."""
    msg = f"(seed {seed}, {len(scene['means'])} Gaussians, {width}x{height}, {formation})"
    skip = ambiguous_pixels(scene, width, height, sh_degree, formation)
    assert skip.float().mean() <= max_ambiguous, f"{int(skip.sum())} ambiguous pixels {msg}"
    keep = ~(film_neighbours(skip) if formation == "blender" else skip)
    outs, grads = render_both(scene, width, height, sh_degree, background, keep=keep, formation=formation)
    ours, ref = outs["cuda"], outs["reference"]
    assert ours.image.shape == (height, width, 3) and ours.alpha.shape == (height, width), msg
    for name in ("image", "alpha", "depth"):
        assert torch.isfinite(getattr(ours, name)).all(), f"{name} has unwritten (NaN) values {msg}"
    assert torch.equal(ours.radii, ref.radii), f"radii differ at {int((ours.radii != ref.radii).sum())} {msg}"
    assert ((ours.means2d - ref.means2d).abs() <= means2d_tolerance(scene, ref.means2d)).all(), msg

    image_diff = (ours.image - ref.image).abs()[keep].max().item() if keep.any() else 0.0
    alpha_diff = (ours.alpha - ref.alpha).abs()[keep].max().item() if keep.any() else 0.0
    depth_scale = max(1.0, ref.depth.abs().max().item())
    depth_diff = (ours.depth - ref.depth).abs()[keep].max().item() / depth_scale if keep.any() else 0.0
    assert image_diff <= IMAGE_TOL, f"image max abs diff {image_diff:.2e} {msg}"
    assert alpha_diff <= IMAGE_TOL, f"alpha max abs diff {alpha_diff:.2e} {msg}"
    assert depth_diff <= IMAGE_TOL, f"depth max rel diff {depth_diff:.2e} {msg}"

    for name in PARAMS + ("means2d",):
        g_ours, g_ref = grads["cuda"][name], grads["reference"][name]
        assert g_ours is not None and g_ours.shape == g_ref.shape, f"{name} grad missing {msg}"
        assert torch.isfinite(g_ours).all(), f"{name} grad not finite {msg}"
        err = rel_l2(g_ours, g_ref)
        assert err <= GRAD_TOL, f"{name} grad relative L2 {err:.2e} {msg}"
    return outs, grads


def rel_l2(ours, ref):
    denom = ref.norm()
    if denom == 0:
        return ours.norm().item()
    return ((ours - ref).norm() / denom).item()

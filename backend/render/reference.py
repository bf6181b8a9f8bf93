"""Pure-torch differentiable rasterizer: the oracle for the CUDA kernels and the CPU rendering path.

It reproduces the tiled kernel's semantics exactly, not just approximately: a Gaussian touches only the
16x16 tiles its radius covers, each tile's splats are composited front to back in (depth, index) order,
alpha is capped at 0.99 and skipped below 1/255, and a pixel stops before the first splat that would drop
its transmittance below 1e-4. Pixel (i, j) is sampled at its centre (i + 0.5, j + 0.5).

Instead of a per-pixel loop it evaluates every (tile entry, pixel of that tile) pair at once and gets the
front-to-back transmittance from a per-tile cumulative sum of log(1 - alpha) in float64; tiles are
processed in chunks so memory stays bounded for large images.

It draws both image formations (formation.py). The blender one keeps the tiles, the alpha cap and floor, the
stop rule and the RADIUS_SIGMAS bound, and differs where Blender does: a splat's alpha at a pixel is its
maximum response along the pixel's ray (its 3D Gaussian evaluated there, no dilation, scales clamped), a tile
takes its splats in the order of those maxima's depths, each at the tile's pixel nearest to the splat's projected
centre, and colours blend in linear light.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..sh import sh_to_rgb
from .constants import (ALPHA_MAX, ALPHA_MIN, DILATION, FOV_CLAMP_MARGIN, MIN_DEPTH_KEY_BITS, NEAR_PLANE,
                        RADIUS_SIGMAS, T_STOP, TILE)
from .formation import BLENDER, FILM_SPLAT_VARIANCE, SCALE_CLAMP, blender_image, check_formation, srgb_to_linear

MAX_CHUNK_PIXEL_ENTRIES = 1 << 24  # (tile entry x pixel) pairs evaluated at once


@dataclass
class RasterOutput:
    image: torch.Tensor  # (H, W, 3) composited over the background
    alpha: torch.Tensor  # (H, W) accumulated opacity = 1 - final transmittance
    depth: torch.Tensor  # (H, W) alpha-weighted view depth, sum of w_i z_i (divide by alpha for the mean)
    means2d: torch.Tensor  # (N, 2) projected centres in pixels; its .grad feeds densification
    radii: torch.Tensor  # (N,) int32 footprint radius in pixels, 0 where culled


@dataclass
class Projected:
    means2d: torch.Tensor  # (N, 2)
    conics: torch.Tensor  # (N, 3) inverse 2D covariance (a, b, c) of [[a, b], [b, c]]
    depths: torch.Tensor  # (N,)
    radii: torch.Tensor  # (N,) int32, 0 where culled
    colors: torch.Tensor  # (N, 3)


@dataclass
class RayProjected:
    """Splats as the blender formation evaluates them along pixels' rays."""
    means2d: torch.Tensor  # (N, 2) projected centres; the rays are evaluated through them, so .grad holds dL/dmeans2d
    frames: torch.Tensor  # (N, 3, 3) M = S^-1 R^T: camera-space vectors into the splat's unit frame (scales clamped)
    centres: torch.Tensor  # (N, 3) M p: the mean p in camera space, in that frame
    depths: torch.Tensor  # (N,) view z of the means
    radii: torch.Tensor  # (N,) int32 half-size of the footprint's bounding box in pixels, 0 where culled
    opacities: torch.Tensor  # (N,) as drawn in this view: lowered where the film filter widens the splat
    rects: tuple  # the footprints' pixel bounding boxes (u_lo, u_hi, v_lo, v_hi), each (N,)
    colors: torch.Tensor  # (N, 3) in linear light
    intrinsics: tuple  # fx, fy, cx, cy


class TileEntries(NamedTuple):
    """The (tile, Gaussian) entries of a view, sorted by (tile, depth, Gaussian index)."""
    tile_ids: torch.Tensor  # (n_entries,) row-major tile index
    gauss_ids: torch.Tensor  # (n_entries,) Gaussian index


def quat_to_rotmat(quats: torch.Tensor) -> torch.Tensor:
    w, x, y, z = torch.nn.functional.normalize(quats, dim=-1).unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], dim=-1).reshape(quats.shape[:-1] + (3, 3))


def project(means, quats, scales, opacities, sh, viewmat, K, width: int, height: int, sh_degree: int) -> Projected:
    """EWA projection of 3D Gaussians to screen-space ellipses, plus view-dependent colour.

    The radius bounds the footprint's major axis (footprint_sigmas deviations of it), so its square holds
    every pixel the splat is drawn on."""
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    x, y, z, in_front, z_safe = view_space(means, viewmat)

    J = perspective_jacobian(x, y, z_safe, K, width, height)
    M = quat_to_rotmat(quats) * scales[:, None, :]
    T = J @ R @ M
    cov2d = T @ T.mT
    a = cov2d[:, 0, 0] + DILATION
    b = cov2d[:, 0, 1]
    c = cov2d[:, 1, 1] + DILATION
    det = a * c - b * b
    valid = in_front & (det > 0)
    det_safe = torch.where(valid, det, torch.ones_like(det))
    conics = torch.stack([c / det_safe, -b / det_safe, a / det_safe], dim=-1)

    mid = 0.5 * (a + c)
    lambda_max = mid + torch.sqrt(torch.clamp_min(mid * mid - det, 0.1))
    radii = torch.ceil(footprint_sigmas(opacities.detach().reshape(-1)) * torch.sqrt(lambda_max.detach()))
    radii = radii.to(torch.int32)
    means2d = torch.stack([fx * x / z_safe + cx, fy * y / z_safe + cy], dim=-1)

    x_lo, x_hi, y_lo, y_hi = tile_rect(means2d.detach(), radii, width, height)
    valid = valid & (radii > 0) & (x_hi > x_lo) & (y_hi > y_lo)
    radii = torch.where(valid, radii, torch.zeros_like(radii))

    campos = -R.T @ t
    dirs = torch.nn.functional.normalize(means - campos, dim=-1)
    colors = sh_to_rgb(sh, dirs, sh_degree)
    return Projected(means2d, conics, z, radii, colors)


def view_space(means, viewmat):
    """The means' camera-space x, y and z, whether each is in front of the near plane, and z where it is (1
    elsewhere, which nothing divides by zero)."""
    x, y, z = (means @ viewmat[:3, :3].T + viewmat[:3, 3]).unbind(-1)
    in_front = z > NEAR_PLANE
    return x, y, z, in_front, torch.where(in_front, z, torch.ones_like(z))


def perspective_jacobian(x, y, z, K, width: int, height: int) -> torch.Tensor:
    """(N, 2, 3) Jacobian of the perspective map at camera-space points (x, y, z), z > 0, taken at the point
    clamped to a margin around the view so Gaussians far outside it do not get huge footprints."""
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    lim_x_pos = (width - cx) / fx + FOV_CLAMP_MARGIN * width / fx
    lim_x_neg = cx / fx + FOV_CLAMP_MARGIN * width / fx
    lim_y_pos = (height - cy) / fy + FOV_CLAMP_MARGIN * height / fy
    lim_y_neg = cy / fy + FOV_CLAMP_MARGIN * height / fy
    tx = z * torch.clamp(x / z, -lim_x_neg, lim_x_pos)
    ty = z * torch.clamp(y / z, -lim_y_neg, lim_y_pos)
    zero = torch.zeros_like(z)
    return torch.stack([fx / z, zero, -fx * tx / z ** 2,
                        zero, fy / z, -fy * ty / z ** 2], dim=-1).reshape(-1, 2, 3)


def footprint_sigmas(opacities):
    """Deviations out to which a splat is drawn (its footprint): where alpha >= ALPHA_MIN, at most RADIUS_SIGMAS."""
    return torch.clamp(torch.sqrt(2 * torch.log(torch.clamp_min(opacities / ALPHA_MIN, 1.0))), max=RADIUS_SIGMAS)


def footprint_t(opacities):
    """The bound d^T conic d <= t that tiles are listed by, the footprint's raised by 1% and 0.01 (as the
    kernels' footprint_t): far more than float error, so every tile holding a pixel the splat is drawn on is
    listed, and the image does not depend on which others are."""
    sigmas = footprint_sigmas(opacities)
    return 1.01 * sigmas * sigmas + 0.01


def tile_grid(width: int, height: int) -> tuple[int, int]:
    """Tiles across and down a width x height image (tile_count in cuda/splatwright.h is their product)."""
    return (width + TILE - 1) // TILE, (height + TILE - 1) // TILE


def tile_rect(means2d, radii, width: int, height: int):
    """Half-open tile ranges [x_lo, x_hi) x [y_lo, y_hi) that a footprint of `radii` around `means2d` covers."""
    tiles_x, tiles_y = tile_grid(width, height)
    u, v = means2d[:, 0], means2d[:, 1]
    r = radii.to(means2d.dtype)
    x_lo = torch.clamp(torch.floor((u - r) / TILE), 0, tiles_x).long()
    x_hi = torch.clamp(torch.floor((u + r) / TILE) + 1, 0, tiles_x).long()
    y_lo = torch.clamp(torch.floor((v - r) / TILE), 0, tiles_y).long()
    y_hi = torch.clamp(torch.floor((v + r) / TILE) + 1, 0, tiles_y).long()
    return x_lo, x_hi, y_lo, y_hi


def bin_tiles(proj: Projected, opacities, width: int, height: int) -> TileEntries:
    """The tiles each splat's footprint meets (within its square, tile_rect): per row of tiles, the columns
    of the ellipse's x-extent over the row (footprint_row in cuda/projection.cuh), a thin ellipse's whole
    row. Sorted by (tile, depth key, Gaussian index), as the kernels' radix sort on (tile, depth key) orders
    them."""
    tiles_x = tile_grid(width, height)[0]
    means2d, conics = proj.means2d.detach(), proj.conics.detach()
    x_lo, x_hi, y_lo, y_hi = tile_rect(means2d, proj.radii, width, height)
    idx = (proj.radii > 0).nonzero().squeeze(1)
    u, v = means2d[idx, 0], means2d[idx, 1]
    A, B, C = conics[idx].unbind(-1)
    D = A * C - B * B
    thin = ~((A > 0) & (C > 0) & (D > 1e-4 * A * C))
    A, C, D = (torch.where(thin, torch.ones_like(x), x) for x in (A, C, D))  # no NaNs in the unused branch
    t = footprint_t(opacities.detach().reshape(-1).to(u.dtype)[idx])
    y_reach = torch.sqrt(A * t / D)
    dy_right = -B * torch.sqrt(t / (C * D))
    x_lo, x_hi, y_lo, rows = x_lo[idx], x_hi[idx], y_lo[idx], (y_hi - y_lo)[idx]
    gauss_parts, tile_parts = [], []
    for k in range(int(rows.max()) if len(idx) else 0):
        sel = (rows > k).nonzero().squeeze(1)
        y = y_lo[sel] + k
        band_lo = (y * TILE).to(u.dtype) - v[sel]
        lo, hi = torch.maximum(band_lo, -y_reach[sel]), torch.minimum(band_lo + TILE, y_reach[sel])
        dr = torch.minimum(torch.maximum(dy_right[sel], lo), hi)
        dl = torch.minimum(torch.maximum(-dy_right[sel], lo), hi)
        a, b, d, ts = A[sel], B[sel], D[sel], t[sel]
        right = (-b * dr + torch.sqrt(torch.clamp_min(a * ts - d * dr * dr, 0))) / a
        left = (-b * dl - torch.sqrt(torch.clamp_min(a * ts - d * dl * dl, 0))) / a
        first = torch.floor((u[sel] + left) / TILE).long()
        end = torch.floor((u[sel] + right) / TILE).long() + 1
        c_lo = torch.where(thin[sel], x_lo[sel], torch.maximum(x_lo[sel], first))
        c_hi = torch.where(thin[sel], x_hi[sel], torch.where(lo > hi, c_lo, torch.minimum(x_hi[sel], end)))
        counts = torch.clamp_min(c_hi - c_lo, 0)
        starts = torch.cumsum(counts, 0) - counts
        local = torch.arange(int(counts.sum()), device=counts.device) - torch.repeat_interleave(starts, counts)
        gauss_parts.append(torch.repeat_interleave(idx[sel], counts))
        tile_parts.append(torch.repeat_interleave(y * tiles_x + c_lo, counts) + local)
    empty = torch.zeros(0, dtype=torch.long, device=proj.radii.device)
    gauss, tile = torch.cat([empty, *gauss_parts]), torch.cat([empty, *tile_parts])
    keys = depth_keys(proj.depths.detach(), proj.radii > 0, depth_key_bits(width, height))[gauss]
    order = torch.argsort(gauss, stable=True)
    order = order[torch.argsort(keys[order], stable=True)]
    order = order[torch.argsort(tile[order], stable=True)]
    return TileEntries(tile[order], gauss[order])


def project_rays(means, quats, scales, opacities, sh, viewmat, K, width: int, height: int,
                 sh_degree: int) -> RayProjected:
    """The blender formation's splats: each one's frame (its clamped scales and rotation in camera space, widened
    by the film filter's part within a pixel), which turns a pixel's ray into its unit frame where its response
    is exp(-|x|^2 / 2), its opacity in this view, the footprint's bounding box (exact: the silhouette of the
    ellipsoid out to footprint_sigmas deviations, a conic seen from the camera), and its colour decoded from sRGB
    to linear light."""
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    x, y, z, in_front, z_safe = view_space(means, viewmat)
    means2d = torch.stack([fx * x / z_safe + cx, fy * y / z_safe + cy], dim=-1)
    # The mean again from its projection and depth: the same point, through which the image's gradient
    # reaches means2d, the screen-space gradient densification reads.
    p = torch.stack([(means2d[:, 0] - cx) / fx * z_safe, (means2d[:, 1] - cy) / fy * z_safe, z_safe], dim=-1)
    clamped = torch.maximum(scales, SCALE_CLAMP * scales.max(dim=-1, keepdim=True).values)
    rotation = R @ quat_to_rotmat(quats)  # the splat's axes in camera space (columns)
    # The film filter's part within a pixel: the splat convolved with an isotropic Gaussian whose projection has
    # FILM_SPLAT_VARIANCE px^2 at its depth, its opacity lowered by the growth of its projected area (the EWA
    # projection's determinants), so that its weight in the image stays.
    spread = FILM_SPLAT_VARIANCE * z_safe * z_safe / (fx * fy)
    widened = torch.sqrt(clamped * clamped + spread[:, None])
    J = perspective_jacobian(x, y, z_safe, K, width, height)
    T = J @ (rotation * clamped[:, None, :])
    cov2d = T @ T.mT
    wide2d = cov2d + spread[:, None, None] * (J @ J.mT)
    area = torch.sqrt(torch.clamp_min(_det2(cov2d), 0) / _det2(wide2d))
    opacities = opacities.reshape(-1) * area
    frames = rotation.mT / widened[:, :, None]
    centres = (frames @ p[:, :, None])[:, :, 0]

    u_lo, u_hi, v_lo, v_hi = silhouette_bounds(frames.detach(), centres.detach(), rotation.detach(),
                                               widened.detach(), z_safe.detach(), opacities.detach(),
                                               K, width, height)
    valid = in_front & (u_hi > 0) & (u_lo < width) & (v_hi > 0) & (v_lo < height)
    u, v = means2d.detach().unbind(-1)
    half = torch.stack([u - u_lo, u_hi - u, v - v_lo, v_hi - v], dim=-1).amax(-1).clamp(0, max(width, height))
    radii = torch.where(valid, torch.ceil(half), torch.zeros_like(half)).to(torch.int32)

    campos = -R.T @ t
    dirs = torch.nn.functional.normalize(means - campos, dim=-1)
    colors = srgb_to_linear(sh_to_rgb(sh, dirs, sh_degree))
    return RayProjected(means2d, frames, centres, z, radii, opacities, (u_lo, u_hi, v_lo, v_hi), colors,
                        (fx, fy, cx, cy))


def _det2(m):
    return m[:, 0, 0] * m[:, 1, 1] - m[:, 0, 1] * m[:, 1, 0]


def silhouette_bounds(frames, centres, rotation, scales, depths, opacities, K, width: int, height: int):
    """Pixel bounding boxes (u_lo, u_hi, v_lo, v_hi) of the pixels whose rays pass within footprint_t(opacity)
    (squared, in the splat's unit frame) of each splat's mean: the silhouette of that ellipsoid, the conic
    d^T C d = 0 of ray directions d = (x, y, 1) with C = (M^T m)(M^T m)^T - (|m|^2 - t) M^T M, whose bounding
    lines come from its dual. Where the ellipsoid reaches the near plane, the whole image."""
    dtype = frames.dtype
    frames, centres, K = frames.double(), centres.double(), K.double()
    t = footprint_t(opacities.double())
    A = frames.mT @ frames
    Am = (frames.mT @ centres[:, :, None])[:, :, 0]
    C = Am[:, :, None] * Am[:, None, :] - ((centres * centres).sum(-1) - t)[:, None, None] * A
    # In pixels: d = H (u, v, 1) with H = K^-1.
    H = torch.linalg.inv(K)
    C = H.T @ C @ H
    nearest = depths.double() - torch.sqrt(t * ((rotation.double()[:, 2, :] * scales.double()) ** 2).sum(-1))
    bounded = nearest > NEAR_PLANE
    eye = torch.eye(3, dtype=torch.float64, device=C.device)
    D = torch.linalg.inv(torch.where(bounded[:, None, None], C, eye))  # the dual conic (up to scale)

    def extent(i: int):
        mid, disc = D[:, i, 2] / D[:, 2, 2], (D[:, i, 2] ** 2 - D[:, i, i] * D[:, 2, 2]) / D[:, 2, 2] ** 2
        r = torch.sqrt(torch.clamp_min(disc, 0))
        return mid - r, mid + r

    (u_lo, u_hi), (v_lo, v_hi) = extent(0), extent(1)
    whole = ~bounded | ~torch.isfinite(u_lo + u_hi + v_lo + v_hi)
    full = torch.tensor([0.0, width, 0.0, height], dtype=torch.float64, device=C.device)
    box = torch.where(whole[:, None], full, torch.stack([u_lo, u_hi, v_lo, v_hi], dim=-1))
    return tuple(b.to(dtype) for b in box.unbind(-1))


def bin_rects(proj: RayProjected, width: int, height: int) -> TileEntries:
    """Every tile of each drawn splat's footprint box, sorted by (tile, order key, Gaussian index): the key is
    the depth of the splat's maximum response (ray_depths; at least 0) along the ray through the tile's pixel
    centre nearest to the splat's projected centre, as the kernels' binning keys them."""
    tiles_x, tiles_y = tile_grid(width, height)
    u_lo, u_hi, v_lo, v_hi = proj.rects
    idx = (proj.radii > 0).nonzero().squeeze(1)
    x_lo = torch.clamp(torch.floor(u_lo[idx] / TILE), 0, tiles_x).long()
    x_hi = torch.clamp(torch.floor(u_hi[idx] / TILE) + 1, 0, tiles_x).long()
    y_lo = torch.clamp(torch.floor(v_lo[idx] / TILE), 0, tiles_y).long()
    y_hi = torch.clamp(torch.floor(v_hi[idx] / TILE) + 1, 0, tiles_y).long()
    cols, rows = x_hi - x_lo, y_hi - y_lo
    counts = cols * rows
    starts = torch.cumsum(counts, 0) - counts
    local = torch.arange(int(counts.sum()), device=counts.device) - torch.repeat_interleave(starts, counts)
    gauss = torch.repeat_interleave(idx, counts)
    span = torch.repeat_interleave(cols, counts)
    tile = (torch.repeat_interleave(y_lo, counts) + local // span) * tiles_x + torch.repeat_interleave(x_lo, counts) \
        + local % span
    x0, y0 = (tile % tiles_x * TILE).to(proj.frames.dtype), (tile // tiles_x * TILE).to(proj.frames.dtype)
    u, v = proj.means2d.detach()[gauss].unbind(-1)
    nearest_x = torch.minimum(torch.maximum(u, x0 + 0.5), x0 + TILE - 0.5)
    nearest_y = torch.minimum(torch.maximum(v, y0 + 0.5), y0 + TILE - 0.5)
    keys = torch.clamp_min(ray_depths(proj, gauss, nearest_x, nearest_y).detach(), 0)
    order = torch.argsort(keys, stable=True)  # gauss is ascending already: equal keys keep index order
    order = order[torch.argsort(tile[order], stable=True)]
    return TileEntries(tile[order], gauss[order])


def splat_rays(proj: RayProjected, gid, px, py):
    """The rays through pixel centres (px, py) (broadcast against gid's splats) in the unit frames of splats
    `gid`, and those splats' centres there (m = M p): (ray, m)."""
    fx, fy, cx, cy = proj.intrinsics
    x, y = (px - cx) / fx, (py - cy) / fy  # the pixel's ray d = (x, y, 1) in camera space
    frame = proj.frames.index_select(0, gid)  # M: camera space into the splat's unit frame
    if x.dim() == 2:  # (E, P) pixels of each entry's tile
        frame = frame[:, None]
    ray = frame[..., 0] * x[..., None] + frame[..., 1] * y[..., None] + frame[..., 2]
    m = proj.centres.index_select(0, gid)
    return ray, (m[:, None, :] if x.dim() == 2 else m)


def ray_depths(proj: RayProjected, gid, px, py):
    """The view z of each splat's maximum response along the ray through pixel centre (px, py): t along d,
    whose z is 1, where t = m.Md / |Md|^2."""
    ray, m = splat_rays(proj, gid, px, py)
    return (m * ray).sum(-1) / (ray * ray).sum(-1)


def depth_key_bits(width: int, height: int) -> int:
    """Bits of the depth key beside the tile: what a 32-bit sort key leaves where that is at least
    MIN_DEPTH_KEY_BITS (up to 2^14 tiles), else 32 (the kernels' 64-bit keys)."""
    tiles_x, tiles_y = tile_grid(width, height)
    short = 32 - max(1, (tiles_x * tiles_y - 1).bit_length())
    return short if short >= MIN_DEPTH_KEY_BITS else 32


def depth_keys(depths, visible, bits: int) -> torch.Tensor:
    """Each Gaussian's depth key (cuda/binning.cu's depth_key), int64: the float32 bits of its depth (positive
    for the visible, so they sort like the values) less the lowest visible ones, shifted right just enough for
    the visible range to fit `bits` bits. Depths within one key step keep index order."""
    depth_bits = depths.float().view(torch.int32).long()
    if not bool(visible.any()):
        return torch.zeros_like(depth_bits)
    lowest, highest = int(depth_bits[visible].min()), int(depth_bits[visible].max())
    shift = max(0, (highest - lowest).bit_length() - bits)
    return (depth_bits - lowest) >> shift


def composite(proj, tile_ids, gauss_ids, opacities, width: int, height: int):
    """Front-to-back alpha compositing per tile. Returns colour (H, W, 3), alpha (H, W), depth (H, W): of
    Projected splats as the standard formation draws them, of RayProjected ones as the blender formation does
    (its colour in linear light)."""
    tiles_x, tiles_y = tile_grid(width, height)
    n_tiles = tiles_x * tiles_y
    ends = torch.cumsum(torch.bincount(tile_ids, minlength=n_tiles), 0).tolist()
    # A ray-evaluated pair holds a few more intermediates (its ray in the splat's frame).
    per_pair = 1 if isinstance(proj, Projected) else 3
    budget = max(1, MAX_CHUNK_PIXEL_ENTRIES // (TILE * TILE * per_pair))
    chunks = []
    t0 = 0
    while t0 < n_tiles:  # chunks of whole tiles holding at most `budget` entries (or one tile)
        e0 = ends[t0 - 1] if t0 > 0 else 0
        t1 = max(t0 + 1, bisect.bisect_right(ends, e0 + budget))
        e1 = ends[t1 - 1]
        tid, gid = tile_ids[e0:e1], gauss_ids[e0:e1]
        if isinstance(proj, Projected):
            pairs = _splat_pairs(proj, tid, gid, tiles_x, opacities)
        else:
            pairs = _ray_pairs(proj, tid, gid, tiles_x, proj.opacities)
        chunks.append(_blend(tid, t0, t1, *pairs))
        t0 = t1
    out = torch.cat(chunks, dim=0)
    # (tiles_y * tiles_x, TILE * TILE, 5) -> (H, W, 5), cropped to the image.
    img = out.reshape(tiles_y, tiles_x, TILE, TILE, 5).permute(0, 2, 1, 3, 4)
    img = img.reshape(tiles_y * TILE, tiles_x * TILE, 5)[:height, :width]
    return img[..., :3], img[..., 3], img[..., 4]


def _pixel_centres(tid, tiles_x: int, dtype, device):
    """The centres (x, y), in pixels, of the TILE * TILE pixels of each tile `tid`: (len(tid), TILE * TILE) each."""
    offsets = torch.arange(TILE, device=device, dtype=dtype) + 0.5
    py_local, px_local = torch.meshgrid(offsets, offsets, indexing="ij")
    px = (tid % tiles_x * TILE).to(dtype)[:, None] + px_local.reshape(-1)
    py = (tid // tiles_x * TILE).to(dtype)[:, None] + py_local.reshape(-1)
    return px, py


def _splat_pairs(proj: Projected, tid, gid, tiles_x: int, opacities):
    """The standard formation's (entry, pixel) pairs of a chunk: alpha (E, P), colours (E, 1, 3), depths (E, 1),
    in the entries' order."""
    px, py = _pixel_centres(tid, tiles_x, proj.means2d.dtype, proj.means2d.device)
    # index_select, not t[gid]: its backward (index_add) sums in a fixed order on the CPU, so training repeats.
    means2d = proj.means2d.index_select(0, gid)
    dx = px - means2d[:, 0, None]
    dy = py - means2d[:, 1, None]
    conic = proj.conics.index_select(0, gid)
    power = -0.5 * (conic[:, 0, None] * dx * dx + conic[:, 2, None] * dy * dy) - conic[:, 1, None] * dx * dy
    alpha = torch.clamp_max(opacities.index_select(0, gid)[:, None] * torch.exp(power), ALPHA_MAX)
    outside = (power > 0) | (power < -0.5 * RADIUS_SIGMAS ** 2) | (alpha < ALPHA_MIN)  # beyond the footprint
    alpha = torch.where(outside, torch.zeros_like(alpha), alpha)
    return alpha, proj.colors.index_select(0, gid)[:, None, :], proj.depths.index_select(0, gid)[:, None]


def _ray_pairs(proj: "RayProjected", tid, gid, tiles_x: int, opacities):
    """The blender formation's (entry, pixel) pairs of a chunk: each splat at its maximum response along the
    pixel's ray. Returns alpha (E, P), colours (E, 1, 3) and depths (E, P) of those maxima, in the entries' order."""
    px, py = _pixel_centres(tid, tiles_x, proj.frames.dtype, proj.frames.device)
    ray, m = splat_rays(proj, gid, px, py)
    ray_sq = (ray * ray).sum(-1)
    # The squared distance from the mean to the ray in the unit frame, |m x Md|^2 / |Md|^2: the cross product
    # keeps it exact where |m| is large (a thin splat seen edge-on), which |m|^2 - (m.Md)^2/|Md|^2 does not.
    dist_sq = (torch.linalg.cross(m.expand_as(ray), ray, dim=-1) ** 2).sum(-1) / ray_sq
    depth = (m * ray).sum(-1) / ray_sq
    alpha = torch.clamp_max(opacities.index_select(0, gid)[:, None] * torch.exp(-0.5 * dist_sq), ALPHA_MAX)
    outside = (dist_sq > RADIUS_SIGMAS ** 2) | (alpha < ALPHA_MIN) | (depth <= NEAR_PLANE)
    alpha = torch.where(outside, torch.zeros_like(alpha), alpha)
    return alpha, proj.colors.index_select(0, gid)[:, None, :], depth


def _blend(tid, t0: int, t1: int, alpha, colors, depths) -> torch.Tensor:
    """Composite the pairs of tiles [t0, t1), entries `tid` sorted by tile, alpha (E, P) in front-to-back order
    with their colours (E, 1, 3) and depths (E, 1 or P). Returns (t1 - t0, TILE * TILE, 5): rgb,
    alpha, depth per pixel of each tile."""
    dtype, device = alpha.dtype, alpha.device
    acc = torch.zeros(t1 - t0, TILE * TILE, 5, dtype=dtype, device=device)
    # Inclusive cumulative log-transmittance along each tile's list; float64 keeps the running sum
    # across the chunk's tiles exact enough to subtract each tile's base.
    log_t = torch.log1p(-alpha).double()
    cum = torch.cumsum(log_t, dim=0)
    is_first = torch.ones_like(tid, dtype=torch.bool)
    is_first[1:] = tid[1:] != tid[:-1]
    first_index = torch.cummax(torch.where(is_first, torch.arange(len(tid), device=device), 0), 0).values
    base = cum.index_select(0, first_index) - log_t.index_select(0, first_index)
    t_incl = torch.exp(cum - base)
    t_before = torch.exp(cum - log_t - base).to(dtype)
    contributes = t_incl >= T_STOP  # monotone along a tile's list, so this means "before the stop"
    weight = torch.where(contributes, alpha * t_before, torch.zeros_like(alpha))
    values = torch.cat([weight[..., None] * colors, weight[..., None], (weight * depths)[..., None]], dim=-1)
    return acc.index_add(0, tid - t0, values)


def rasterize(means, quats, scales, opacities, sh, viewmat, K, width: int, height: int,
              sh_degree: int, background, formation: str = "standard") -> RasterOutput:
    """Render Gaussians (world-space means, quaternions, positive scales, opacities in [0, 1], SH
    coefficients (N, K, 3)) through an OpenCV camera (world-to-camera `viewmat`, intrinsics `K`) in an image
    formation (formation.py): the image is in display values either way, the blender formation's composited
    over the background in linear light."""
    proj = project_splats(means, quats, scales, opacities, sh, viewmat, K, width, height, sh_degree, formation)
    return draw(proj, opacities, width, height, background, formation)


def project_splats(means, quats, scales, opacities, sh, viewmat, K, width: int, height: int, sh_degree: int,
                   formation: str = "standard") -> Projected | RayProjected:
    """The first half of rasterize: each Gaussian on its own (what it does to one row depends on that row
    alone, so a share of the rows projects as it does among all of them)."""
    if check_formation(formation) == BLENDER:
        return project_rays(means, quats, scales, opacities, sh, viewmat, K, width, height, sh_degree)
    return project(means, quats, scales, opacities, sh, viewmat, K, width, height, sh_degree)


def draw(proj: Projected | RayProjected, opacities, width: int, height: int, background,
         formation: str = "standard") -> RasterOutput:
    """The second half of rasterize: the projected splats (and, for the standard formation, their opacities)
    binned, sorted and composited into the image."""
    if check_formation(formation) == BLENDER:
        tile_ids, gauss_ids = bin_rects(proj, width, height)
    else:
        tile_ids, gauss_ids = bin_tiles(proj, opacities, width, height)
    if proj.means2d.requires_grad:
        proj.means2d.retain_grad()
    color, alpha, depth = composite(proj, tile_ids, gauss_ids, opacities, width, height)
    if formation == BLENDER:
        image, alpha, depth = blender_image(color, alpha, depth, background)
    else:
        image = color + (1 - alpha)[..., None] * torch.as_tensor(background, dtype=color.dtype, device=color.device)
    return RasterOutput(image, alpha, depth, proj.means2d, proj.radii)

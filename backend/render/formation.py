"""Image formations: how a model's splats make an image. A model is trained for one and looks right in it.

- "standard": 3D Gaussian Splatting's, which other viewers and trainers draw: each splat an EWA-projected ellipse
  widened by the 0.3 px dilation, its colour (0.5 + SH, at least 0) blended as it is, in display (sRGB) values,
  splats in the order of their centres' depths.
- "blender": what Blender 5.3 draws a native GAUSSIAN_SPLAT point cloud with (Cycles' gsplat_intersect.h and
  gsplat.h): each splat's colour (0.5 + SH, at least 0, not clamped above 1, as Cycles' decoding leaves it)
  taken as sRGB, converted to linear light and blended there, over the background's linear colour, the result
  turned back into display values as the Standard view transform does; each splat evaluated along each pixel's
  ray at its maximum response in 3D (no screen-space dilation), its scales clamped to at least SCALE_CLAMP of
  its largest; in each 16x16 tile the splats taken in the order of the depths of their maximum responses, each
  along the ray through the tile's pixel nearest to the splat's projected centre (close to a ray tracer's order,
  which Cycles converges to, and the same for every pixel of a tile, as a tiled rasterizer draws); and the image seen through Blender's film filter
  (FILM_FILTER_WIDTH), which both engines apply.

The reference rasterizer and the CUDA kernels draw both.
Why the blender formation is what it is, measured against bpy 5.3: backend/README.md, "Image formation".
"""
from __future__ import annotations

import torch

from blender_addon.core.settings import FORMATIONS

STANDARD, BLENDER = FORMATIONS
SCALE_CLAMP = 1e-3  # blender: each scale at least this fraction of the splat's largest (Cycles' clamp)
# Blender's film filter: Cycles' Blackman-Harris of filter width 1.5 px (the default), which it spreads over twice
# that width (intern/cycles/scene/film.cpp), a weighted mean of each pixel's rays over 3 px, 0.42 px standard
# deviation; EEVEE's film fits a Gaussian to the same. It is applied in two parts: its taps at whole-pixel
# offsets to the linear image (film), and the rest of its variance, what falls between pixel centres, to each
# splat as a Gaussian of FILM_SPLAT_VARIANCE px^2 whose weight is its own (reference.project_rays).
FILM_FILTER_WIDTH = 1.5
_SRGB_KNEE = 0.04045  # sRGB values at or below this are linear (x / 12.92)
_LINEAR_KNEE = 0.0031308  # ... and their linear values at or below this


def check_formation(formation: str) -> str:
    if formation not in FORMATIONS:
        raise ValueError(f"unknown image formation {formation!r}; choose one of {', '.join(FORMATIONS)}")
    return formation


def _power(x: torch.Tensor, p: float) -> torch.Tensor:
    """x ** p for x > 0, as exp(p log x): torch's CPU pow rounds the elements past a tensor's last whole vector
    otherwise than the rest, so a splat's colour would depend on where it sits in its tensor (a partitioned
    process's share against the whole model); its exp and log round every element alike."""
    return torch.exp(torch.log(x) * p)


def srgb_to_linear(c: torch.Tensor) -> torch.Tensor:
    """The sRGB decoding (IEC 61966-2-1) of values in [0, 1]."""
    curve = _power((torch.clamp_min(c, _SRGB_KNEE) + 0.055) / 1.055, 2.4)  # clamped: no NaN in the unused branch
    return torch.where(c <= _SRGB_KNEE, c / 12.92, curve)


def linear_to_srgb(x: torch.Tensor) -> torch.Tensor:
    """The sRGB encoding of linear values in [0, 1]: what Blender's Standard view transform shows them as."""
    curve = 1.055 * _power(torch.clamp_min(x, _LINEAR_KNEE), 1 / 2.4) - 0.055
    return torch.where(x <= _LINEAR_KNEE, 12.92 * x, curve)


def blackman_harris(x: torch.Tensor, width: float) -> torch.Tensor:
    """Cycles' Blackman-Harris filter of filter width `width` at offsets `x` in pixels (zero beyond its span)."""
    span = 2 * width
    v = 2 * torch.pi * (x / span + 0.5)
    w = 0.35875 - 0.48829 * torch.cos(v) + 0.14128 * torch.cos(2 * v) - 0.01168 * torch.cos(3 * v)
    return torch.where(x.abs() < width, w, torch.zeros_like(w))


def _film_parts(width: float) -> tuple[tuple[float, float, float], float]:
    """The film filter's taps at offsets -1, 0, 1 (normalised) and the variance (px^2) they leave to the splats."""
    xs = torch.linspace(-width, width, 30001, dtype=torch.float64)
    w = blackman_harris(xs, width)
    variance = float((w * xs * xs).sum() / w.sum())
    side = float(blackman_harris(torch.tensor(1.0, dtype=torch.float64), width)
                 / blackman_harris(torch.tensor(0.0, dtype=torch.float64), width))
    taps = (side / (1 + 2 * side), 1 / (1 + 2 * side), side / (1 + 2 * side))
    return taps, variance - 2 * taps[0]


FILM_TAPS, FILM_SPLAT_VARIANCE = _film_parts(FILM_FILTER_WIDTH)
FILM_TAP_SIDE, FILM_TAP_CENTRE = FILM_TAPS[:2]  # the kernels' names for them (cuda/constants.h)


def film(image: torch.Tensor) -> torch.Tensor:
    """The film filter's taps applied to an (H, W, C) image of linear values (rows and columns in turn; the
    edges' pixels stand in for what lies beyond). Sums of shifted copies, not a convolution: cuDNN convolves
    float32 in TF32 on recent GPUs, 5e-4 off."""
    def along(x: torch.Tensor, dim: int) -> torch.Tensor:
        n = x.shape[dim]
        before = torch.cat([x.narrow(dim, 0, 1), x.narrow(dim, 0, n - 1)], dim)
        after = torch.cat([x.narrow(dim, 1, n - 1), x.narrow(dim, n - 1, 1)], dim)
        return FILM_TAP_SIDE * before + FILM_TAP_CENTRE * x + FILM_TAP_SIDE * after

    return along(along(image, 1), 0)


def blender_image(color: torch.Tensor, alpha: torch.Tensor, depth: torch.Tensor, background):
    """The blender formation's image of its splats' composite, colour (H, W, 3) in linear light (weighted by
    each splat's share), alpha and depth (H, W): over the background's linear colour, through the film filter,
    in display values. Returns (image, alpha, depth), alpha and depth filtered alike."""
    background = torch.as_tensor(background, dtype=color.dtype, device=color.device)
    linear = color + (1 - alpha)[..., None] * srgb_to_linear(background)
    filtered = film(torch.cat([linear, alpha[..., None], depth[..., None]], dim=-1))
    return linear_to_srgb(filtered[..., :3]), filtered[..., 3], filtered[..., 4]

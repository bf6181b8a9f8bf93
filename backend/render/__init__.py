"""Rendering: one entry point over interchangeable rasterizers (the pure-torch reference or CUDA)."""
from __future__ import annotations

import functools

import torch

from blender_addon.core.cameras import Camera
from ..gaussians import Gaussians
from . import cuda, reference
from .formation import BLENDER, STANDARD, check_formation
from .reference import RasterOutput

RASTERIZERS = ("reference", "cuda")


def camera_tensors(cam: Camera, device, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """World-to-camera matrix and intrinsics of `cam` as tensors."""
    return (torch.as_tensor(cam.w2c, dtype=dtype, device=device),
            torch.as_tensor(cam.K, dtype=dtype, device=device))


def rasterizer_fn(name: str, formation: str = STANDARD):
    """The rasterize function of a rasterizer that draws `formation` (render/formation.py)."""
    if name == "reference":
        return functools.partial(reference.rasterize, formation=check_formation(formation))
    if name == "cuda":  # builds the extension at first use
        return cuda.rasterize_blender if check_formation(formation) == BLENDER else cuda.rasterize
    raise ValueError(f"unknown rasterizer {name!r}; choose one of {RASTERIZERS}")


def render(g: Gaussians, cam: Camera, sh_degree: int, background, rasterizer: str = "reference",
           view: tuple[torch.Tensor, torch.Tensor] | None = None, formation: str = STANDARD) -> RasterOutput:
    """Render `g` through `cam` in an image formation. `view` is the camera's (viewmat, K) on the model's device,
    for callers that render the same cameras repeatedly and keep them there."""
    viewmat, K = view if view is not None else camera_tensors(cam, g.means.device, g.means.dtype)
    return rasterizer_fn(rasterizer, formation)(
        g.means, g.quats, torch.exp(g.log_scales), g.opacities, g.sh, viewmat, K,
        cam.width, cam.height, min(sh_degree, g.max_sh_degree), background)

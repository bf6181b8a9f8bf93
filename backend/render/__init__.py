"""Rendering: one entry point over interchangeable rasterizers (the pure-torch reference or CUDA)."""
from __future__ import annotations

import functools

import torch

from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from ..gaussians import Gaussians
from . import cuda, reference
from .formation import STANDARD, check_formation
from .reference import RasterOutput

RASTERIZERS = ("reference", "cuda")


def camera_tensors(cam: Camera, device, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """World-to-camera matrix and intrinsics of `cam` as tensors."""
    return (torch.as_tensor(cam.w2c, dtype=dtype, device=device),
            torch.as_tensor(cam.K, dtype=dtype, device=device))


def rasterizer_fn(name: str, formation: str = STANDARD):
    """The rasterize function of a rasterizer that draws `formation` (render/formation.py); the CUDA kernels draw
    the standard one only."""
    if name == "reference":
        return functools.partial(reference.rasterize, formation=check_formation(formation))
    if name == "cuda":
        if check_formation(formation) != STANDARD:
            raise SplatwrightError(f"the CUDA rasterizer draws the standard image formation only, not {formation!r}; "
                                   "the reference rasterizer draws both")
        return cuda.rasterize  # builds the extension at first use
    raise ValueError(f"unknown rasterizer {name!r}; choose one of {RASTERIZERS}")


def drawn_formation(rasterizer: str, formation: str, doing: str = "draws") -> tuple[str, str]:
    """The image formation `rasterizer` draws when asked for `formation`, and a line saying so where that is
    another ('' where it is not): the CUDA kernels draw the standard formation only, so a GPU draws (and trains,
    `doing`) in it what is asked for in Blender's, never silently and never refusing."""
    if rasterizer == "cuda" and check_formation(formation) != STANDARD:
        return STANDARD, (f"image formation {formation!r} is not in the CUDA kernels yet: the GPU {doing} in the "
                          f"standard one instead, as 3DGS viewers draw models, not as Blender does (the CPU "
                          f"reference rasterizer {doing} in {formation!r})")
    return formation, ""


def render(g: Gaussians, cam: Camera, sh_degree: int, background, rasterizer: str = "reference",
           view: tuple[torch.Tensor, torch.Tensor] | None = None, formation: str = STANDARD) -> RasterOutput:
    """Render `g` through `cam` in an image formation. `view` is the camera's (viewmat, K) on the model's device,
    for callers that render the same cameras repeatedly and keep them there."""
    viewmat, K = view if view is not None else camera_tensors(cam, g.means.device, g.means.dtype)
    return rasterizer_fn(rasterizer, formation)(
        g.means, g.quats, torch.exp(g.log_scales), g.opacities, g.sh, viewmat, K,
        cam.width, cam.height, min(sh_degree, g.max_sh_degree), background)

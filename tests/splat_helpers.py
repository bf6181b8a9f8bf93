"""The splat scenarios' side in pytest (tests/blender/scenarios/splats*.py): the models of the sessions they
reopen, and what the backend draws of a model where a splat object places it."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from blender_addon.logic.colors import linear_to_srgb
from blender_addon.core.codecs import camera_from_wire
from blender_addon.logic.placement import camera_in_model
from backend.dynamic import DynamicGaussians
from backend.gaussians import Gaussians, rgb_to_sh_dc
from backend.render import render
from helpers import orbit_cameras, random_gaussians

SESSION = "splat-model"
SECOND = "splat-second"  # a session whose model the backend does not show: renders load its checkpoint
BACKGROUND = (0.3, 0.5, 0.7)  # the session's, which the frames are composited over and which is taken out
MARKER_AT, MARKER_RGB = (0.0, -0.5, 1.25), (1.0, 0.1, 0.1)  # an isolated Gaussian (in front of the wall)
DEPTH_MARGIN = 0.05  # splats this close to a surface may fall either side of it in a pixel
LEVEL = 1 / 255


def splat_model() -> Gaussians:
    """A cluster of mostly opaque Gaussians around the origin and, above it, one red marker Gaussian."""
    g = random_gaussians(300, seed=5, sh_degree=1, scale=0.07)
    g.opacity_logits = g.opacity_logits + 3.0
    marker = Gaussians(means=torch.tensor([MARKER_AT]), log_scales=torch.full((1, 3), math.log(0.06)),
                       quats=torch.tensor([[1.0, 0.0, 0.0, 0.0]]), opacity_logits=torch.tensor([5.0]),
                       sh_dc=rgb_to_sh_dc(torch.tensor([[MARKER_RGB]])), sh_rest=torch.zeros(1, 3, 3))
    return Gaussians(**{k: torch.cat([getattr(g, k), getattr(marker, k)]) for k in Gaussians.names()})


def second_model() -> Gaussians:
    g = random_gaussians(150, seed=8, sh_degree=1, scale=0.1)
    g.opacity_logits = g.opacity_logits + 3.0
    return g


def trained_session(workdir: Path, model: Gaussians, name: str = SESSION, iterations: int = 1) -> str:
    """A backend session in `workdir` whose checkpoint holds `model` at step 1 of `iterations`, as training leaves
    one (two small views): finished, or with steps left to continue."""
    from backend.service.session import Session
    from backend.train import TrainConfig, Trainer
    workdir.mkdir(parents=True, exist_ok=True)
    session = Session.open(workdir, name, create=True)
    for i, cam in enumerate(orbit_cameras(2, 16, 16)):
        with torch.no_grad():
            image = render(model, cam, model.max_sh_degree, BACKGROUND).image.clamp(0, 1)
        session.add_view(cam, (image.numpy() * 255 + 0.5).astype(np.uint8), f"view_{i}")
    cfg = TrainConfig(iterations=iterations, sh_degree=model.max_sh_degree, sh_interval=1, background=BACKGROUND,
                      dynamic=isinstance(model, DynamicGaussians))
    trainer = Trainer(session.dataset(BACKGROUND), cfg, "cpu", model.detached())
    trainer.step = 1  # past the SH schedule: the full degree shows
    trainer.save_checkpoint(session.checkpoint_path)
    return name


def backend_frame(model: Gaussians, cam) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the backend sends for `cam`, rows top-down: the straight display colours with the background taken
    out, alpha, and the view depth (alpha-normalised), from its RGBA8 frame."""
    with torch.no_grad():
        out = render(model, cam, model.max_sh_degree, BACKGROUND)
    rgba = (torch.cat([out.image, out.alpha[..., None]], -1).clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()
    alpha = rgba[..., 3:] / 255.0
    straight = np.clip((rgba[..., :3] / 255.0 - np.array(BACKGROUND) * (1 - alpha)) / np.maximum(alpha, 1e-6), 0, 1)
    depth = (out.depth / out.alpha.clamp_min(1e-12)).numpy()
    return straight, alpha[..., 0], depth


def placed_frame(model: Gaussians, camera, model_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """backend_frame of `model` placed by `model_matrix`, seen through the scene's `camera` (wire form), its
    depths in the scene's units (infinite where nothing is drawn)."""
    cam, depth_scale = camera_in_model(camera_from_wire(camera), np.array(model_matrix))
    straight, alpha, depth = backend_frame(model, cam)
    return straight, alpha, np.where(alpha > 0, depth * depth_scale, np.inf)


def inside_crop(model: Gaussians, crop) -> torch.Tensor:
    means = model.means.double().numpy()
    crop = np.array(crop)
    return torch.from_numpy(np.all(np.abs(means @ crop[:3, :3].T + crop[:3, 3]) <= 1.0, axis=-1))


def subset(model: Gaussians, keep: torch.Tensor) -> Gaussians:
    return Gaussians(**{k: v[keep] for k, v in model.tensors().items()})


def png(path: str) -> np.ndarray:
    return np.asarray(Image.open(path), dtype=np.float64) / 255.0


def srgb8(linear) -> np.ndarray:
    """The display values a PNG holds for scene-linear colours, in [0, 1]."""
    return np.round(linear_to_srgb(np.asarray(linear)) * 255) / 255


def depth_of_wall(cam) -> np.ndarray:
    """The view depth of the wall (the plane y = 0) at each pixel of `cam`."""
    j, i = np.mgrid[0:cam.height, 0:cam.width] + 0.5
    rays = np.stack([(i - cam.K[0, 2]) / cam.K[0, 0], (j - cam.K[1, 2]) / cam.K[1, 1], np.ones_like(i)], -1)
    return -cam.c2w[1, 3] / (rays @ cam.c2w[:3, :3].T)[..., 1]

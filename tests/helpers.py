"""Shared test helpers: small synthetic scenes and models made on the fly (no downloads, no shared data needed),
and waiting for a condition."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from blender_addon.core.cameras import BLENDER_TO_OPENCV, Camera, intrinsics_from_fov_x, look_at  # noqa: E402
from backend.gaussians import Gaussians
from backend.render import render

ROOT = Path(__file__).resolve().parent.parent
DONUT = ROOT.parent / "shared" / "data" / "splats" / "donut_sh0.ply"


def orbit_cameras(n: int, width: int, height: int, radius: float = 3.0, fov_x: float = 0.9) -> list[Camera]:
    K = intrinsics_from_fov_x(fov_x, width, height)
    cams = []
    for i in range(n):
        az = 2 * math.pi * i / n
        eye = [radius * math.cos(az), radius * math.sin(az), 0.8 + 0.3 * math.sin(3 * az)]
        cams.append(Camera(look_at(eye, [0, 0, 0]), K, width, height))
    return cams


def random_gaussians(n: int, seed: int = 0, sh_degree: int = 3, scale: float = 0.08) -> Gaussians:
    gen = torch.Generator().manual_seed(seed)
    g = Gaussians.random_in_box(n, [0, 0, 0], 0.8, sh_degree, seed)
    g.log_scales = math.log(scale) + 0.3 * torch.randn(n, 3, generator=gen)
    g.quats = torch.nn.functional.normalize(torch.randn(n, 4, generator=gen), dim=-1)
    g.opacity_logits = torch.randn(n, generator=gen)
    g.sh_rest = 0.1 * torch.randn(g.sh_rest.shape, generator=gen)
    return g


def write_scene(folder: Path, model: Gaussians, cameras: list[Camera], split: str = "train",
                background=(1.0, 1.0, 1.0), formation: str = "standard") -> Path:
    """Render `model` from `cameras` in an image formation into PNGs + a NeRF-synthetic transforms_<split>.json:
    RGBA for the standard formation, whose compositing over the background the loader repeats, and opaque views
    over `background` for the blender formation, which composites in linear light."""
    (folder / split).mkdir(parents=True, exist_ok=True)
    frames = []
    for i, cam in enumerate(cameras):
        with torch.no_grad():
            if formation == "standard":
                out = render(model, cam, model.max_sh_degree, (0.0, 0.0, 0.0))
                # Un-premultiply so the loader's compositing over the background reproduces the render.
                rgb = torch.where(out.alpha[..., None] > 0, out.image / out.alpha[..., None].clamp_min(1e-6), 0.0)
                alpha = out.alpha
            else:
                rgb = render(model, cam, model.max_sh_degree, background, formation=formation).image
                alpha = torch.ones_like(rgb[..., 0])
        rgba = torch.cat([rgb.clamp(0, 1), alpha[..., None]], dim=-1)
        Image.fromarray((rgba.numpy() * 255 + 0.5).astype(np.uint8), "RGBA").save(folder / split / f"r_{i}.png")
        frames.append({"file_path": f"./{split}/r_{i}",
                       "transform_matrix": (cam.c2w @ BLENDER_TO_OPENCV).tolist()})
    fov_x = 2 * math.atan(0.5 * cameras[0].width / cameras[0].K[0, 0])
    path = folder / f"transforms_{split}.json"
    path.write_text(json.dumps({"camera_angle_x": fov_x, "frames": frames}))
    return path


def viewing_model(folder: Path) -> tuple[Gaussians, Path]:
    """The small model the Blender engine tests view, and its PLY in `folder`."""
    from backend.formats.ply import write_ply
    model = random_gaussians(400, seed=3, sh_degree=1)
    model.means *= 1.5
    write_ply(folder / "model.ply", model)
    return model, folder / "model.ply"


def moving_model(n: int = 80, seed: int = 6):
    """A small 4D model whose Gaussians move, turn and fade in and out."""
    from backend.dynamic import DynamicGaussians
    model = DynamicGaussians.from_static(random_gaussians(n, seed=seed, sh_degree=1, scale=0.12))
    gen = torch.Generator().manual_seed(seed)
    model.velocities = 0.6 + 0.2 * torch.randn(n, 3, generator=gen)
    model.accelerations = 0.3 * torch.randn(n, 3, generator=gen)
    model.angular_velocities = torch.randn(n, 3, generator=gen)
    model.time_precisions = 2.0 * torch.rand(n, generator=gen)
    return model


def assert_same_model(a: Gaussians, b: Gaussians, atol: float = 0.0) -> None:
    assert type(a) is type(b) and a.names() == b.names()
    for name in a.names():
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=atol, rtol=0.0 if atol == 0 else 1e-5,
                                   msg=name)


def wait_until(condition, timeout=60.0):
    """Wait for `condition`; the timeout only ends a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "hung: the condition never came true"
        time.sleep(0.005)

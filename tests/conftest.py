"""Shared test helpers: small synthetic scenes made on the fly (no downloads, no shared data needed)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blender_addon.core.cameras import BLENDER_TO_OPENCV, Camera, intrinsics_from_fov_x, look_at  # noqa: E402
from backend.gaussians import Gaussians  # noqa: E402
from backend.render import render  # noqa: E402

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
                background=(1.0, 1.0, 1.0)) -> Path:
    """Render `model` from `cameras` into PNGs + a NeRF-synthetic transforms_<split>.json."""
    (folder / split).mkdir(parents=True, exist_ok=True)
    frames = []
    for i, cam in enumerate(cameras):
        with torch.no_grad():
            out = render(model, cam, model.max_sh_degree, (0.0, 0.0, 0.0))
        # Un-premultiply so the loader's compositing over the background reproduces the render.
        rgb = torch.where(out.alpha[..., None] > 0, out.image / out.alpha[..., None].clamp_min(1e-6), 0.0)
        rgba = torch.cat([rgb.clamp(0, 1), out.alpha[..., None]], dim=-1)
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


@pytest.fixture
def tiny_scene(tmp_path) -> Path:
    """A 32x32 scene: 8 train and 3 test views of a random 300-Gaussian model."""
    model = random_gaussians(300, seed=1, sh_degree=1)
    write_scene(tmp_path, model, orbit_cameras(8, 32, 32), "train")
    write_scene(tmp_path, model, orbit_cameras(3, 32, 32, radius=3.2), "test")
    return tmp_path

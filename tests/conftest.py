"""The fixtures the test files share; the helpers they share are in helpers.py, server_helpers.py,
splat_helpers.py, cuda_helpers.py and the Blender harness (blender/)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import build_addon
from backend.render import render
from blender.runner import SCREEN
from blender_addon.core.points import POINTS_FILE, write_points
from helpers import MIXED_SIZES, cameras_of_sizes, orbit_cameras, random_gaussians, write_scene, x_display
from server_helpers import SIZE, ServerProcess


@pytest.fixture
def tiny_scene(tmp_path) -> Path:
    """A 32x32 scene: 8 train and 3 test views of a random 300-Gaussian model."""
    model = random_gaussians(300, seed=1, sh_degree=1)
    write_scene(tmp_path, model, orbit_cameras(8, 32, 32), "train")
    write_scene(tmp_path, model, orbit_cameras(3, 32, 32, radius=3.2), "test")
    return tmp_path


@pytest.fixture
def mixed_size_scene(tmp_path) -> Path:
    """A scene whose views have the three MIXED_SIZES: 6 train and 3 test views of a random 300-Gaussian model,
    and as its points3d.ply 150 points where the model is and 3 strays far from them and from each other, as a
    sparse reconstruction may have."""
    model = random_gaussians(300, seed=1, sh_degree=1)
    write_scene(tmp_path, model, cameras_of_sizes(6, MIXED_SIZES), "train")
    write_scene(tmp_path, model, cameras_of_sizes(3, MIXED_SIZES, radius=3.2), "test")
    rng = np.random.default_rng(0)
    xyz = np.concatenate([rng.uniform(-0.5, 0.5, (150, 3)), [[60.0, 0, 0], [0, -90.0, 0], [0, 0, 120.0]]])
    write_points(tmp_path / POINTS_FILE, xyz, rng.integers(0, 256, (153, 3)))
    return tmp_path


@pytest.fixture
def start_server():
    servers = []

    def start(workdir: Path, *args: str, **popen) -> ServerProcess:
        servers.append(ServerProcess(workdir, *args, **popen))
        return servers[-1]
    yield start
    for s in servers:
        s.kill()


@pytest.fixture(scope="module")
def scene():
    """A random 300-Gaussian model and six 32x32 views of it: (model, cameras, top-down uint8 RGB images)."""
    model = random_gaussians(300, seed=1, sh_degree=1)
    cameras = orbit_cameras(6, SIZE, SIZE)
    images = []
    with torch.no_grad():
        for cam in cameras:
            image = render(model, cam, 1, (1.0, 1.0, 1.0)).image
            images.append((image.clamp(0, 1).numpy() * 255 + 0.5).astype(np.uint8))
    return model, cameras, images


@pytest.fixture
def blender_scene(tmp_path):
    """A 32x32 scene drawn in Blender's image formation over white: 8 train and 3 test views of a random model."""
    model = random_gaussians(300, seed=1, sh_degree=1)
    write_scene(tmp_path, model, orbit_cameras(8, 32, 32), "train", formation="blender")
    write_scene(tmp_path, model, orbit_cameras(3, 32, 32, radius=3.2), "test", formation="blender")
    return tmp_path


@pytest.fixture(scope="module")
def poisoned_kernels():
    """The CUDA extension with its outputs NaN-poisoned, so that an unwritten pixel or Gaussian fails."""
    from backend.kernels import extension
    module = extension()
    module.set_poison_outputs(True)
    yield module
    module.set_poison_outputs(False)


@pytest.fixture(scope="module")
def addon_zip(tmp_path_factory) -> Path:
    return build_addon.build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def xvfb():
    yield from x_display(*SCREEN)

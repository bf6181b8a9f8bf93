"""The CUDA rasterizer in Blender's image formation (backend/render/formation.py) against the reference (float32,
both on the GPU), on fresh random scenes with flat splats among them, with test_cuda_rasterizer.py's tolerances and
exclusions (in this formation also a splat's maximum within rounding of the near plane, and the neighbours of such
pixels, which the film filter mixes them into); and training in that formation on a GPU."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from backend.data import load_split
from backend.train import Trainer, evaluate
from cuda_helpers import GPU_TEST, check_against_reference, fresh_seed, random_scene
from helpers import formation_config

pytestmark = GPU_TEST


def flat_scene(n, width, height, gen, **kw):
    """random_scene's Gaussians, a third of them flat (one scale 1/50 of the others): their maxima along a ray
    move across their footprints, and they cross the others."""
    scene = random_scene(n, width, height, gen, **kw)
    scene["scales"][: n // 3, 2] *= 0.02
    return scene


@pytest.mark.parametrize("n, width, height, sh_degree", [
    (1500, 256, 192, 3),
    (1000, 203, 141, 2),  # not multiples of 16
    (600, 97, 250, 0),
])
def test_random_scenes_match_reference(n, width, height, sh_degree):
    seed = fresh_seed()
    scene = flat_scene(n, width, height, torch.Generator().manual_seed(seed))
    check_against_reference(scene, width, height, sh_degree, seed=seed, formation="blender")


def test_more_splats_in_a_tile_than_one_batch():
    seed = fresh_seed()
    scene = flat_scene(3000, 48, 40, torch.Generator().manual_seed(seed), scale=0.2)
    check_against_reference(scene, 48, 40, 1, seed=seed, formation="blender", max_ambiguous=5e-3)


def test_splats_crossing_the_near_plane_and_covering_the_image():
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    scene = flat_scene(400, 96, 64, gen, z_range=(0.05, 4.0), scale=0.3)
    check_against_reference(scene, 96, 64, 2, seed=seed, formation="blender", max_ambiguous=5e-3)


def test_a_gpu_trains_in_blender_formation(blender_scene):
    data = load_split(blender_scene, "train")
    trainer = Trainer(data, replace(formation_config(40, "blender"), rasterizer="cuda"), "cuda")
    assert trainer.cfg.image_formation == "blender" and trainer.without_autograd

    def training_views_psnr():
        return evaluate(trainer.g, data, trainer.sh_degree, trainer.cfg.background, "cuda", "blender")["psnr"]
    before = training_views_psnr()
    while trainer.step < 40:
        trainer.train_step()
    assert training_views_psnr() > before + 1

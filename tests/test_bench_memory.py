"""`bench memory`: its arguments, its clear refusal without a GPU, and cameras that frame the model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.tools.bench import BENCHMARKS
from backend.tools.bench.memory import main, orbit_cameras
from helpers import random_gaussians


def test_it_is_a_benchmark_and_checks_its_arguments(capsys):
    assert "memory" in BENCHMARKS
    with pytest.raises(SystemExit) as exit_:
        main(["--steps", "0"])
    assert exit_.value.code == 2 and "must be positive" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no GPU")
def test_without_a_gpu_it_says_so(capsys):
    assert main(["--steps", "10", "--views", "2"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_orbit_cameras_frame_the_model():
    g = random_gaussians(500, seed=2)
    g.means = g.means * torch.tensor([1.0, 0.5, 0.2]) + torch.tensor([3.0, -1.0, 0.5])
    cameras = orbit_cameras(g, 30, 192, 108)
    assert len(cameras) == 30 and len({tuple(c.position.round(6)) for c in cameras}) == 30
    means = g.means.numpy()
    center = np.median(means, axis=0)
    for cam in cameras:
        (uv,), (depth,) = cam.world_to_pixel(center[None])
        np.testing.assert_allclose(uv, [96, 54], atol=1.0)  # the model's centre in the middle
        assert depth > 0 and cam.position[2] > center[2]  # over the model, looking at it
        pixels, depths = cam.world_to_pixel(means)
        inside = (depths > 0) & (pixels[:, 0] >= 0) & (pixels[:, 0] < 192) & (pixels[:, 1] >= 0) & (pixels[:, 1] < 108)
        assert inside.mean() > 0.97

"""The video benchmark's pipeline (backend/tools/bench/video.py), small: the frames taken from its video are
paired with the cameras they were drawn from, and its points move into the exact cameras' frame by the camera
centres' similarity. Its figures: bench/results/video-*.md."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from backend.data.dataset import Dataset
from backend.data.video import extract_frames
from backend.service.limits import Limits
from backend.tools.bench import video as bench
from blender_addon.core.cameras import Camera

pytest.importorskip("av", reason="PyAV is not installed (pyproject.toml's dependencies have it)")

FRAMES = 6


def test_each_frame_taken_from_the_video_gets_the_camera_it_was_drawn_from(tmp_path):
    cameras = bench.orbit(FRAMES * 8, 64, 48)[:FRAMES]  # an eighth of a turn: neighbours differ a little
    drawn = bench.draw(bench.textured_scene(), cameras)
    frames = extract_frames(bench.encode(drawn, tmp_path / "v.mp4"), tmp_path, Limits().check, lambda *a: None,
                            rate=bench.FPS)
    names = sorted(p.stem for p in frames.folder.iterdir())
    assert [bench.frame_index(name) for name in names] == list(range(FRAMES))
    # Stands for the registered views: exact_split takes their names alone.
    sfm = Dataset(cameras, [torch.zeros((48, 64, 3), dtype=torch.uint8)] * FRAMES, names)
    exact = bench.exact_split(tmp_path, sfm, bench.orbit(FRAMES * 8, 64, 48), downscale=1.0)
    for i, (cam, image) in enumerate(zip(exact.cameras, exact.images)):
        error = [np.abs(image.numpy().astype(float) - frame).mean() for frame in drawn]
        assert int(np.argmin(error)) == i and np.allclose(cam.c2w, cameras[i].c2w)


def test_the_points_move_with_the_similarity_of_the_camera_centres():
    cameras = bench.orbit(8, 32, 24)
    angle, scale, shift = 0.7, 2.5, np.array([1.0, -2.0, 0.5])
    rotation = np.array([[math.cos(angle), -math.sin(angle), 0], [math.sin(angle), math.cos(angle), 0], [0, 0, 1]])
    # The reconstruction's frame: x = (R^T (y - t)) / s for a point y of the exact frame.
    moved = [Camera(np.block([[rotation.T @ c.c2w[:3, :3], (rotation.T @ (c.position - shift) / scale)[:, None]],
                              [np.zeros((1, 3)), np.ones((1, 1))]]), c.K, c.width, c.height) for c in cameras]
    points = np.random.default_rng(0).normal(size=(20, 3))
    as_seen = (points - shift) @ rotation / scale
    images = [torch.zeros((24, 32, 3), dtype=torch.uint8)] * 8
    aligned = bench.aligned_points(as_seen, [Dataset(moved, images, list("abcdefgh"))],
                                   [Dataset(cameras, images, list("abcdefgh"))])
    np.testing.assert_allclose(aligned, points, atol=1e-6)

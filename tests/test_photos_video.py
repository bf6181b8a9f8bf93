"""Structure from motion from a video (backend/data/video.py and photos.py): a short video of a synthetic scene
(drawn by the reference renderer along a camera path, encoded with H.264 in the test, pausing once: a frame
between two blurred repeats) gives its frames at the rate, the pause its sharpest frame only, and every frame registers into
a dataset that loads. Also: the video's caps, too few registered frames, cancelling."""
from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter

from backend.data import load_split
from backend.data.photos import Cancelled, reconstruct
from backend.data.video import FRAMES, extract_frames
from backend.gaussians import Gaussians
from backend.render import render
from backend.service.limits import Limits
from backend.tools import cli
from backend.tools.bench.video import encode
from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from blender_addon.core.colmap import TEST_EVERY
from blender_addon.core.errors import SplatwrightError
from helpers import random_gaussians

pytest.importorskip("pycolmap", reason="pycolmap is not installed (pyproject.toml's dependencies have it)")
av = pytest.importorskip("av", reason="PyAV is not installed (pyproject.toml's dependencies have it)")

WIDTH, HEIGHT = 192, 144  # the video's frames
FRAME_COUNT = 48  # along 3/4 of a turn around the scene
FPS = 12
PAUSE_AT = 20  # the camera pauses here: this frame comes between two blurred repeats of it
BACKGROUND = (1.0, 1.0, 1.0)
CHECK = Limits().check


def scene() -> Gaussians:
    """3000 opaque blobs of random colours in a box: blobs are what SIFT finds."""
    g = random_gaussians(3000, seed=3, sh_degree=0, scale=0.05)
    g.opacity_logits = torch.full_like(g.opacity_logits, 3.0)
    g.sh_dc = (torch.rand(g.sh_dc.shape, generator=torch.Generator().manual_seed(5)) - 0.5) * 3
    return g


def camera_path() -> list[Camera]:
    K = intrinsics_from_fov_x(0.9, WIDTH, HEIGHT)
    cams = []
    for i in range(FRAME_COUNT):
        az = 1.5 * math.pi * i / FRAME_COUNT
        eye = [3.0 * math.cos(az), 3.0 * math.sin(az), 0.8 + 0.3 * math.sin(2 * az)]
        cams.append(Camera(look_at(eye, [0, 0, 0]), K, WIDTH, HEIGHT))
    return cams


def blur(frame: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(frame).filter(ImageFilter.GaussianBlur(1.5)))


@pytest.fixture(scope="module")
def reconstruction(tmp_path_factory):
    """The video of the frames drawn along the path, with the pause, through `photos`; (its result, its progress)."""
    model = scene()
    frames = []
    with torch.no_grad():
        for cam in camera_path():
            image = render(model, cam, 0, BACKGROUND).image.clamp(0, 1)
            frames.append((image.numpy() * 255 + 0.5).astype(np.uint8))
    blurred = blur(frames[PAUSE_AT])
    shown = frames[:PAUSE_AT] + [blurred, frames[PAUSE_AT], blurred] + frames[PAUSE_AT + 1:]
    video = encode(shown, tmp_path_factory.mktemp("video") / "orbit.mp4", FPS)
    stages = []
    result = reconstruct(video, tmp_path_factory.mktemp("sfm"), CHECK,
                         lambda stage, done, total: stages.append((stage, done, total)), rate=FPS)
    return result, stages


@pytest.mark.slow
def test_the_frames_are_taken_at_the_rate_and_the_pause_keeps_its_sharpest(reconstruction):
    result, stages = reconstruction
    assert result.sampled == FRAME_COUNT + 2 and result.photos == FRAME_COUNT
    names = sorted(p.name for p in (result.folder / FRAMES).iterdir())
    assert len(names) == FRAME_COUNT
    assert names[PAUSE_AT] == f"{round((PAUSE_AT + 1) * 1000 / FPS):08d}.jpg"  # the sharp frame between the blurred
    assert names[PAUSE_AT + 1] == f"{round((PAUSE_AT + 3) * 1000 / FPS):08d}.jpg"  # frames are named by their time
    decoded = FRAME_COUNT + 2
    assert stages[0][:2] == ("decoding", 0) and stages.index(("decoding", decoded, decoded)) < stages.index(
        ("features", 0, FRAME_COUNT))
    assert {"stereo", "run-colmap-geometric.sh"}.isdisjoint(p.name for p in result.folder.iterdir())


@pytest.mark.slow
def test_every_frame_registers_into_a_dataset_that_loads(reconstruction):
    result, _ = reconstruction
    assert result.registered == FRAME_COUNT, result
    train, test = load_split(result.folder, "train"), load_split(result.folder, "test")
    assert len(test) == FRAME_COUNT // TEST_EVERY and len(train) + len(test) == FRAME_COUNT
    assert train.names[0] == sorted(p.stem for p in (result.folder / FRAMES).iterdir())[1]  # named by time


def noise_video(path: Path, frames: int = 20, size: tuple[int, int] = (64, 48), fps: int = 10) -> Path:
    """A video of random pixels that change every frame."""
    rng = np.random.default_rng(0)
    return encode([rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) for _ in range(frames)], path, fps)


def test_a_video_goes_through_the_upload_limits(tmp_path, capsys):
    video = noise_video(tmp_path / "v.mp4")  # 20 frames of 64x48 in 2 s
    with pytest.raises(SplatwrightError, match="--max-views"):
        extract_frames(video, tmp_path / "a", Limits(views=5).check, lambda *a: None, rate=10)
    with pytest.raises(SplatwrightError, match="--max-view-pixels"):
        extract_frames(video, tmp_path / "b", Limits(view_pixels=64 * 47).check, lambda *a: None)
    assert cli.main(["photos", str(video), "--out", str(tmp_path / "c"), "--max-video-seconds", "1"]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ") and "run photos with --max-video-seconds N to allow more" in error
    frames = extract_frames(video, tmp_path / "d", CHECK, lambda *a: None, rate=1.5)  # at 0, 2/3 and 4/3 s
    assert (frames.sampled, frames.kept) == (3, 3)
    assert sorted(p.name for p in frames.folder.iterdir()) == ["00000000.jpg", "00000700.jpg", "00001400.jpg"]


def test_too_few_registered_frames_say_how_many_and_why_in_one_line(tmp_path, capsys):
    video = noise_video(tmp_path / "noise.mp4")
    assert cli.main(["photos", str(video), "--out", str(tmp_path / "out"), "--rate", "10"]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ") and "registered" in error and "of 20 frames" in error
    assert "the camera likely moves too fast or too little" in error


def test_a_reconstruction_stops_when_cancelled(tmp_path):
    video = noise_video(tmp_path / "noise.mp4")
    cancel = threading.Event()

    def progress(stage, done, total):
        if stage == "features":
            cancel.set()
    with pytest.raises(Cancelled, match="cancelled during features"):
        reconstruct(video, tmp_path / "out", CHECK, progress, rate=10, cancel=cancel)

"""bench dynamic's data handling on the CPU: a JPEG dataset over time as backend/tools/bench/blender_dynamic.py
writes it (DatasetWriter with an image extension), its views grouped by time into per-frame sets, the bars and
the report, and the render-rate timer on the reference rasterizer."""
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from backend.tools.bench.dynamic import check_bars, frame_sets, render_fps, report, subset, views_by_time
from backend.data import load_split
from backend.dynamic import DynamicGaussians
from blender_addon.core.errors import SplatwrightError
from blender_addon.logic.dataset import DatasetWriter, frame_time, split_of, training_views
from helpers import orbit_cameras, random_gaussians

CAPTURED = (1, 3, 5, 7)  # frames
BETWEEN = (2, 6)  # held-out frames between them
TIMES = [frame_time(f, 1, 7) for f in CAPTURED]


def colour(camera: int, frame: int) -> tuple[int, int, int]:
    """The flat colour of a camera's image at a frame."""
    return 40 * camera + 20, 25 * frame + 20, 128


def rgb255(images: torch.Tensor) -> np.ndarray:
    """Pixels as numbers in [0, 255], whether a dataset stores them as uint8 or as floats in [0, 1]."""
    return images.numpy().astype(np.float64) * (1.0 if images.dtype == torch.uint8 else 255.0)


@pytest.fixture(scope="module")
def timed_scene(tmp_path_factory):
    """16x16 JPEGs in the D-NeRF layout: cameras 0, 2, 4 train and 1, 3 are held out at the captured frames
    (train, test), and the held-out ones also at frames between (val); each image one flat colour."""
    folder = tmp_path_factory.mktemp("timed")
    writer = DatasetWriter(folder, extension=".jpg")
    cameras = orbit_cameras(5, 16, 16)
    views = [(f, i, split_of(i, 2)) for f in CAPTURED for i in range(5)]
    views += [(f, i, "val") for f in BETWEEN for i in range(5) if split_of(i, 2) == "test"]
    for f, i, split in views:
        name = f"camera{i}_f{f:03d}"
        Image.new("RGB", (16, 16), colour(i, f)).save(writer.image_path(split, name), quality=95)
        writer.add(split, name, cameras[i], frame_time(f, CAPTURED[0], CAPTURED[-1]))
    writer.write()
    return folder


def test_a_jpeg_dataset_over_time_loads_with_its_times(timed_scene):
    train, test, val = (load_split(timed_scene, split) for split in ("train", "test", "val"))
    assert (len(train), len(test), len(val)) == (12, 8, 4)
    assert train.times == [t for t in TIMES for _ in range(3)]
    assert val.times == [frame_time(f, 1, 7) for f in BETWEEN for _ in range(2)]
    assert train.names[:2] == ["camera0_f001.jpg", "camera2_f001.jpg"]
    np.testing.assert_allclose(rgb255(train.images[1][8, 8]), colour(2, 1), atol=3)
    views = training_views(timed_scene)
    assert [name for name, _, _, _ in views][:2] == ["camera0_f001", "camera2_f001"]
    assert all(image.suffix == ".jpg" and image.is_file() for _, _, image, _ in views)


def test_per_frame_sets_are_the_loaded_views_of_each_time(timed_scene):
    train, test = load_split(timed_scene, "train"), load_split(timed_scene, "test")
    groups = views_by_time(train)
    assert list(groups) == TIMES and all(len(views) == 3 for views in groups.values())
    part = subset(train, groups[TIMES[2]])
    assert part.times == [TIMES[2]] * 3 and part.names == ["camera0_f005.jpg", "camera2_f005.jpg", "camera4_f005.jpg"]
    assert all(a is b for a, b in zip(part.images, train.images[6:9], strict=True))  # shared, not copied
    assert part.cameras == train.cameras[6:9]

    frames = frame_sets(train, test)
    assert [t for t, _, _ in frames] == TIMES
    for (t, frame_train, frame_test), f in zip(frames, CAPTURED):
        assert frame_train.times is None and len(frame_train) == 3  # trains a static model
        assert frame_test.times == [t, t] and frame_test.names == [f"camera1_f{f:03d}.jpg", f"camera3_f{f:03d}.jpg"]
        np.testing.assert_allclose(rgb255(torch.stack(frame_train.images)[:, 8, 8]),
                                   [colour(i, f) for i in (0, 2, 4)], atol=3)
    assert [t for t, _, _ in frame_sets(train, test, 2)] == [TIMES[0], TIMES[-1]]
    assert len(frame_sets(train, test, 3)) == 3 and len(frame_sets(train, test, 10)) == 4


def test_per_frame_sets_need_times_the_training_views_have(timed_scene):
    train, val = load_split(timed_scene, "train"), load_split(timed_scene, "val")
    with pytest.raises(SplatwrightError, match="no times"):
        views_by_time(replace(train, times=None))
    with pytest.raises(SplatwrightError, match="have no training views"):
        frame_sets(train, val)


def rows(psnr=30.0, frames_psnr=30.5, static_psnr=25.0, seconds=100.0, frames_seconds=600.0, fps=400.0):
    """The 4D, per-frame and all-frames rows of a result, with these figures."""
    four_d = {"steps": 15000, "seconds": seconds, "test": {"psnr": psnr, "ssim": 0.95},
              "val": {"psnr": psnr - 1, "ssim": 0.94}, "gaussians": 200000, "peak_bytes": 2e9, "fps": fps}
    per_frame = {"steps": 12000, "models": 24, "seconds": frames_seconds, "seconds_all_frames": frames_seconds,
                 "test": {"psnr": frames_psnr, "ssim": 0.96}, "gaussians": 150000, "peak_bytes": 1e9, "fps": 600.0}
    static = {**four_d, "test": {"psnr": static_psnr, "ssim": 0.8}, "val": {"psnr": static_psnr, "ssim": 0.8}}
    return four_d, per_frame, static


def test_the_bars():
    assert [ok for _, ok in check_bars(*rows())] == [True] * 5
    assert [ok for _, ok in check_bars(*rows(frames_psnr=31.5, static_psnr=27.5))] == [False, True, False, True, True]
    assert [ok for _, ok in check_bars(*rows(seconds=200.0, fps=250.0))] == [True, False, True, False, False]
    text, _ = check_bars(*rows())[0]
    assert text == "4D PSNR within 1 dB of the per-frame models' mean: 30.00 vs 30.50 dB"


def test_the_report_lists_every_model_and_bar():
    four_d, per_frame, static = rows(frames_psnr=31.5)
    per_frame = {**per_frame, "models": 6, "seconds_all_frames": 2400.0}
    result = {"scene": "dynamic", "views": {"train": 384, "test": 96, "val": 24}, "cameras": {"train": 16, "test": 4},
              "times": 24, "device": "GPU", "commit": "abc", "date": "2026-12-01 12:00 UTC", "frame_preset": "quality",
              "steps_override": None, "models": {"4d": four_d, "per_frame": per_frame, "static": static},
              "bars": [{"check": text, "passed": ok} for text, ok in check_bars(four_d, per_frame, static)]}
    text = report(result)
    assert "| 4D (dynamic, 15000 steps) | 100.0 | 30.00 | 0.9500 | 29.00 | 0.9400 | 200000 | 2.00 | 400 |" in text
    assert "| per-frame static x6 (quality, 12000 steps each; time: total) | 600.0 | 31.50 | 0.9600 | - | - |" in text
    assert "on 6 of the 24 times (--frames); their total time over all times, from the mean: 2400 s" in text
    assert "- FAIL: 4D PSNR within 1 dB" in text and text.count("- pass:") == 4


def test_render_fps_on_the_reference_rasterizer():
    model = DynamicGaussians.from_static(random_gaussians(20, sh_degree=0))
    model.velocities = torch.ones_like(model.means)
    assert render_fps(model, orbit_cameras(1, 16, 16)[0], 0, (1.0, 1.0, 1.0), "reference", 3) > 0

"""COLMAP captures as datasets: text and binary models read to the same cameras, the held-out split, COLMAP's
pose and pixel conventions, training from the model's points, and malformed models refused in one line.

The captures here are synthetic, so that every value is known: a random Gaussian model rendered from our
own orbit cameras, written as a COLMAP model by helpers.write_capture (from COLMAP's documented file layouts),
with the model's points as points3D and their projections as the images' 2D observations. A reconstruction
of real photos (tests/data/colmap_skull) is read and imported into Blender in tests/test_colmap_bpy.py.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from backend.data import colmap, load_cameras, load_split
from backend.tools import cli
from blender_addon.core.cameras import Camera
from blender_addon.core.colmap import UNDISTORTED
from blender_addon.core.errors import SplatwrightError
from helpers import cameras_of_sizes, orbit_cameras, write_capture

@pytest.fixture
def capture(tmp_path) -> tuple[Path, list[Camera], dict]:
    cams = orbit_cameras(10, 24, 20)
    return tmp_path, cams, write_capture(tmp_path, cams, binary=True)


@pytest.mark.parametrize("binary", [True, False])
def test_a_colmap_model_reads_to_our_cameras_and_points(tmp_path, binary):
    cams = orbit_cameras(10, 24, 20)
    truth = write_capture(tmp_path, cams, binary=binary)
    model = colmap.read_model(colmap.find_model(tmp_path))
    assert np.allclose(model.xyz, truth["xyz"], atol=1e-6) and np.array_equal(model.rgb, truth["rgb"])
    assert sorted(im.name for im in model.images.values()) == [f"{n}.png" for n in truth["names"]]
    loaded, names = load_cameras(tmp_path)
    assert names == truth["names"]
    for got, want in zip(loaded, cams):
        assert np.allclose(got.c2w, want.c2w, atol=1e-9) and np.allclose(got.K, want.K)
        assert (got.width, got.height) == (want.width, want.height)
    # The model's 2D observations are where our cameras project its points (COLMAP's pixel convention is ours).
    for image in model.images.values():
        cam = colmap.camera_of(model, image, image.name)
        uv, _ = cam.world_to_pixel(model.xyz[image.point_ids - 1])
        assert np.abs(uv - image.xys).max() < 1e-6


def test_colmap_poses_are_world_to_camera_and_pixel_centres_are_at_half_pixels():
    """A hand-computed case: a quarter turn about z and a translation, a SIMPLE_PINHOLE camera."""
    half = math.sqrt(0.5)
    image = colmap.ColmapImage("a.png", 1, np.array([half, 0, 0, half]), np.array([0.5, -1.0, 3.0]),
                               np.zeros((0, 2)), np.zeros(0, np.int64))
    model = colmap.Model({1: colmap.ColmapCamera("SIMPLE_PINHOLE", 40, 30, (50.0, 20.0, 15.0))}, {1: image},
                         np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8), np.zeros(0, np.int64))
    cam = colmap.camera_of(model, image, "a.png")
    X = np.array([[1.0, 2.0, 1.0]])
    x_cam = np.array([[0, -1, 0], [1, 0, 0], [0, 0, 1]]) @ X[0] + image.tvec  # R(q) X + t, R = quarter turn
    uv, depth = cam.world_to_pixel(X)
    assert np.allclose(depth, x_cam[2])
    assert np.allclose(uv[0], [50 * x_cam[0] / x_cam[2] + 20, 50 * x_cam[1] / x_cam[2] + 15])


def test_every_eighth_image_by_name_is_held_out(capture):
    root, cams, truth = capture
    train, test = load_split(root, "train"), load_split(root, "test")
    assert test.names == [truth["names"][0], truth["names"][8]]
    assert train.names == [n for i, n in enumerate(truth["names"]) if i % 8]
    assert torch.stack(train.images).shape == (8, 20, 24, 3)
    rendered = np.asarray(Image.open(root / "images" / f"{truth['names'][1]}.png"), dtype=np.float32) / 255
    assert torch.allclose(train.image(0), torch.from_numpy(rendered))
    half = load_split(root, "train", downscale=2.0)
    assert torch.stack(half.images).shape == (8, 10, 12, 3)
    assert np.allclose(half.cameras[0].K[0, 0], cams[1].K[0, 0] / 2)


def test_images_smaller_than_the_cameras_declare_scale_the_intrinsics(capture):
    root, cams, truth = capture
    for name in truth["names"]:
        path = root / "images" / f"{name}.png"
        Image.open(path).resize((12, 10)).save(path)
    train = load_split(root, "train")
    assert {tuple(im.shape) for im in train.images} == {(10, 12, 3)}
    assert np.allclose(train.cameras[0].K[:2], cams[1].K[:2] / 2)


@pytest.mark.parametrize("binary", [True, False])
def test_images_of_several_sizes_load_each_at_its_own(tmp_path, binary):
    """As COLMAP's image_undistorter leaves them: one camera per size, the photos a few pixels apart."""
    sizes = [(24, 20), (24, 21), (23, 20)]
    cams = cameras_of_sizes(10, sizes)
    truth = write_capture(tmp_path, cams, binary=binary)
    train, test = load_split(tmp_path, "train"), load_split(tmp_path, "test")
    for data in (train, test):
        for i, (cam, name) in enumerate(zip(data.cameras, data.names)):
            truth_cam = cams[truth["names"].index(name)]
            assert (cam.width, cam.height) == (truth_cam.width, truth_cam.height)
            np.testing.assert_allclose(cam.K, truth_cam.K, atol=1e-9)
            rendered = np.asarray(Image.open(tmp_path / "images" / f"{name}.png"), dtype=np.float32) / 255
            assert torch.allclose(data.image(i), torch.from_numpy(rendered))  # the whole photo, not cropped
    assert {(c.width, c.height) for c in train.cameras} == set(sizes)


def test_undistorted_layout_and_simple_pinhole(tmp_path):
    cams = orbit_cameras(3, 16, 16)
    write_capture(tmp_path, cams, binary=False, model="SIMPLE_PINHOLE", folder="sparse")
    assert colmap.find_model(tmp_path) == tmp_path / "sparse"
    assert np.allclose(load_cameras(tmp_path)[0][0].K, cams[0].K)


@pytest.mark.parametrize("model", ["SIMPLE_RADIAL", "OPENCV"])
def test_distorted_camera_models_load_undistorted_beside_the_model(tmp_path, model):
    pytest.importorskip("pycolmap", reason="pycolmap is not installed (pyproject.toml's dependencies have it)")
    write_capture(tmp_path, orbit_cameras(3, 16, 16), binary=True, model=model)
    views = load_split(tmp_path, "train")
    assert len(views.cameras) == 2  # the first of 3 is held out
    undistorted = colmap.read_model(colmap.find_model(tmp_path / UNDISTORTED))
    assert {cam.model for cam in undistorted.cameras.values()} == {"PINHOLE"}


def test_camera_models_pycolmap_does_not_undistort_here_are_refused_with_how_to(tmp_path):
    write_capture(tmp_path, orbit_cameras(3, 16, 16), binary=True, model="FOV")
    with pytest.raises(SplatwrightError, match="FOV has lens distortion.*colmap image_undistorter"):
        load_split(tmp_path, "train")


def test_train_on_a_colmap_capture_starts_from_its_points(capture, capsys):
    root, _, truth = capture
    out = root / "out"
    assert cli.main(["train", str(root), "--out", str(out), "--iters", "3", "--device", "cpu"]) == 0
    assert f"starting from the 60 points of {root / 'sparse' / '0'}" in capsys.readouterr().err
    assert (out / "splats.ply").is_file()
    assert cli.main(["render", str(out / "splats.ply"), "--cameras", str(root), "--out", str(root / "views"),
                     "--device", "cpu"]) == 0
    assert sorted(p.name for p in (root / "views").iterdir()) == [f"{n}.png" for n in truth["names"]]


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-5])


def append(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0" * 3)


@pytest.mark.parametrize("breakage, message", [
    (lambda root: truncate(root / "sparse/0/images.bin"), "unreadable COLMAP .bin model"),
    (lambda root: append(root / "sparse/0/points3D.bin"), "the record count does not match the data"),
    (lambda root: (root / "sparse/0/points3D.bin").unlink(), "COLMAP model without points3D.bin"),
    (lambda root: (root / "images" / "frame_003.png").unlink(), "image frame_003.png of the COLMAP model is not in"),
])
def test_malformed_models_are_refused_in_one_line(capture, capsys, breakage, message):
    root = capture[0]
    breakage(root)
    assert cli.main(["train", str(root), "--out", str(root / "out"), "--iters", "1", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]

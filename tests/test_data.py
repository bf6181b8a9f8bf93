import json

import numpy as np
import pytest
import torch

from backend.data.dataset import Dataset, camera_extent, scene_bounds
from backend.data.images import as_float, load_rgb, parse_background, quantise
from backend.data import load_cameras, load_split
from blender_addon.core.errors import SplatwrightError
from backend.data import LEGO
from blender_addon.core.cameras import Camera, look_at
from helpers import MIXED_SIZES, cameras_of_sizes, orbit_cameras


def test_loads_splits_composited_over_the_background(tiny_scene):
    white = torch.stack(load_split(tiny_scene, "train", (1.0, 1.0, 1.0)).images)
    black = torch.stack(load_split(tiny_scene, "train", (0.0, 0.0, 0.0)).images)
    assert white.shape == (8, 32, 32, 3) and len(load_split(tiny_scene, "test")) == 3
    corner_white, corner_black = white[:, 0, 0], black[:, 0, 0]
    assert torch.all(corner_white >= corner_black)
    assert (white.float() - black.float()).abs().max() > 0.5 * 255  # transparent pixels differ


@pytest.mark.parametrize("background", [(1.0, 1.0, 1.0), (0.5, 0.25, 0.0)])
def test_views_are_stored_as_bytes_of_the_float_images(tiny_scene, background):
    """uint8 round(255 x) of each float view x as loaded (composited over the background), read back as
    x' = v / 255 by Dataset.image."""
    data = load_split(tiny_scene, "train", background)
    assert torch.stack(data.images).shape == (8, 32, 32, 3) and all(im.dtype == torch.uint8 for im in data.images)
    for i, name in enumerate(data.names):
        x = torch.from_numpy(load_rgb(tiny_scene / "train" / f"{name}.png", background))
        assert torch.equal(data.images[i], torch.round(255 * x).to(torch.uint8)), name
        image = data.image(i)
        assert image.dtype == torch.float32 and torch.equal(image, data.images[i].float() / 255)
        assert (image - x).abs().max() <= 0.5 / 255 + 1e-6
    half = load_split(tiny_scene, "train", background, downscale=2)
    assert torch.stack(half.images).shape == (8, 16, 16, 3) and all(im.dtype == torch.uint8 for im in half.images)


def test_quantise_rounds_and_clamps_and_datasets_hold_only_bytes():
    x = torch.tensor([-0.1, 0.0, 0.4 / 255, 0.6 / 255, 0.5, 1.0, 1.3])
    assert quantise(x).tolist() == [0, 0, 0, 1, 128, 255, 255]
    assert quantise(x.numpy()).tolist() == quantise(x).tolist()
    u = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(quantise(u), u) and torch.equal(quantise(as_float(u)), u)
    assert torch.equal(as_float(x), x)
    with pytest.raises(TypeError, match="uint8"):
        Dataset(orbit_cameras(1, 4, 4), torch.zeros(1, 4, 4, 3), ["a"])


def test_cameras_survive_the_file_round_trip(tiny_scene):
    cams, names = load_cameras(tiny_scene / "transforms_train.json")
    for loaded, original in zip(cams, orbit_cameras(8, 32, 32)):
        np.testing.assert_allclose(loaded.c2w, original.c2w, atol=1e-12)
        np.testing.assert_allclose(loaded.K, original.K, atol=1e-9)
    assert names[0] == "r_0"


def test_downscale_resizes_images_and_intrinsics(tiny_scene):
    d = load_split(tiny_scene, "train", downscale=2)
    assert {tuple(im.shape) for im in d.images} == {(16, 16, 3)}
    assert d.cameras[0].K[0, 2] == pytest.approx(8.0)


def test_missing_folder_and_a_file_for_a_folder(tmp_path):
    with pytest.raises(SplatwrightError, match="nope: not found; give the scene folder"):
        load_split(tmp_path / "nope", "train")
    (tmp_path / "transforms.json").write_text("{}")
    with pytest.raises(SplatwrightError, match="transforms.json: not a folder; give the scene folder"):
        load_split(tmp_path / "transforms.json", "train")


def test_missing_image(tiny_scene):
    (tiny_scene / "train" / "r_3.png").unlink()
    with pytest.raises(SplatwrightError, match="frame 3: image not found"):
        load_split(tiny_scene, "train")


def test_views_of_several_sizes_load_whole_each_at_its_own_size(mixed_size_scene):
    cams = cameras_of_sizes(6, MIXED_SIZES)  # the scene's training cameras
    data = load_split(mixed_size_scene, "train")
    assert [(c.width, c.height) for c in data.cameras] == [(c.width, c.height) for c in cams]
    for i, cam in enumerate(cams):
        np.testing.assert_allclose(data.cameras[i].K, cam.K, atol=1e-9)
        whole = torch.from_numpy(load_rgb(mixed_size_scene / "train" / f"r_{i}.png", (1.0, 1.0, 1.0)))
        assert data.image(i).shape == (cam.height, cam.width, 3)
        assert (data.image(i) - whole).abs().max() <= 0.5 / 255 + 1e-6
    half = load_split(mixed_size_scene, "train", downscale=2)
    assert [tuple(im.shape[:2]) for im in half.images] == [(c.height, c.width) for c in (c.scaled(0.5) for c in cams)]


def test_a_dataset_refuses_an_image_of_another_size_than_its_camera():
    cams = cameras_of_sizes(2, MIXED_SIZES)
    with pytest.raises(ValueError, match=r"view 1's image is \(30, 32, 3\), but its camera is 32x31"):
        Dataset(cams, [torch.zeros(30, 32, 3, dtype=torch.uint8)] * 2, ["a", "b"])


@pytest.mark.parametrize("matrix, message", [
    ([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]], "singular"),
    ([[1, 0.5, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], "not a proper rotation"),
])
def test_bad_matrices(tiny_scene, matrix, message):
    path = tiny_scene / "transforms_train.json"
    meta = json.loads(path.read_text())
    meta["frames"][2]["transform_matrix"] = matrix
    path.write_text(json.dumps(meta))
    with pytest.raises(SplatwrightError, match=f"frame 2: .*{message}"):
        load_split(tiny_scene, "train")


def test_instant_ngp_intrinsics(tiny_scene):
    path = tiny_scene / "transforms_train.json"
    meta = json.loads(path.read_text())
    del meta["camera_angle_x"]
    meta.update({"fl_x": 40.0, "fl_y": 42.0, "cx": 15.0, "cy": 17.0, "w": 32, "h": 32})
    path.write_text(json.dumps(meta))
    cam = load_split(tiny_scene, "train").cameras[0]
    np.testing.assert_allclose(cam.K, [[40, 0, 15], [0, 42, 17], [0, 0, 1]])


def test_mean_color_is_over_every_pixel_of_every_view():
    images = torch.zeros(2, 4, 5, 3, dtype=torch.uint8)
    images[0, :, :, 0] = 255  # a red view
    images[1, :2, :, 2] = 102  # half of a view 0.4 blue
    data = Dataset(orbit_cameras(2, 5, 4), images, ["a", "b"])
    assert data.mean_color() == pytest.approx((0.5, 0.0, 0.1))
    red, blue = torch.zeros(4, 5, 3, dtype=torch.uint8), torch.zeros(2, 5, 3, dtype=torch.uint8)
    red[..., 0], blue[..., 2] = 255, 255
    sizes = Dataset(cameras_of_sizes(2, [(5, 4), (5, 2)]), [red, blue], ["a", "b"])
    assert sizes.mean_color() == pytest.approx((2 / 3, 0.0, 1 / 3))  # each pixel counts once


def test_backgrounds():
    assert parse_background("black") == (0.0, 0.0, 0.0)
    assert parse_background("0.5,0.25,1") == (0.5, 0.25, 1.0)
    with pytest.raises(SplatwrightError, match="background"):
        parse_background("purple")


@pytest.mark.skipif(not LEGO.is_dir(), reason="shared/data/lego not present")
def test_lego_bounds_hold_the_object():
    cams, _ = load_cameras(LEGO / "transforms_train.json")
    center, half = scene_bounds(cams)
    assert np.linalg.norm(center) < 0.3  # lego sits at the origin
    assert 1.0 < half < 2.5


def test_bounds_of_cameras_looking_at_an_object_and_out_of_a_room():
    around = orbit_cameras(12, 64, 48, radius=3.0)
    center, half = scene_bounds(around)
    assert np.linalg.norm(center) < 0.2 and half < 3.0  # the object's region, not the cameras'
    turn = np.diag([-1.0, 1.0, -1.0, 1.0])  # half a turn about each camera's y axis: the same places, looking out
    inside = [Camera(c.c2w @ turn, c.K, c.width, c.height) for c in orbit_cameras(12, 64, 48, radius=1.0)]
    center, half = scene_bounds(inside)
    positions = np.stack([c.position for c in inside])
    assert np.all(np.abs(positions - center) < half)  # the cameras are inside it
    assert half >= 1.5  # and the walls they look at, beyond them


def test_the_scene_extent_leaves_out_far_cameras():
    orbit = orbit_cameras(12, 64, 48, radius=3.0)
    centres = np.stack([c.position for c in orbit])
    extent = camera_extent(orbit)
    assert extent == pytest.approx(1.1 * np.linalg.norm(centres - centres.mean(0), axis=1).max())  # 3DGS's
    far = [Camera(look_at(eye, [0, 0, 0]), orbit[0].K, 64, 48) for eye in ([80, 0, 5], [0, -150, 0], [40, 40, 200])]
    assert camera_extent(orbit + far) == pytest.approx(extent)
    assert camera_extent(orbit[:2]) > 0 and camera_extent(orbit[:1]) == pytest.approx(1.1e-3)
    inside = [Camera(c.c2w @ np.diag([-1.0, 1.0, -1.0, 1.0]), c.K, c.width, c.height) for c in orbit + far]
    center, half = scene_bounds(inside)  # cameras among the scene: a cube around those that are not strays
    assert np.linalg.norm(center - centres.mean(0)) < 1e-9 and half == pytest.approx(1.5 * extent)

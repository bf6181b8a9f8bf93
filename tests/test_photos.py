"""Structure from motion from a folder of photos (backend/data/photos.py, through pycolmap): the skull's photos
(tests/data/colmap_skull) without their model register, and their cameras agree with the shipped model after a
similarity alignment; the dataset written loads, and a SIMPLE_RADIAL model loads and trains after the loader
undistorts it;
too few photos, or photos over the upload limits, end with a message that says what to do."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from backend.data import colmap, load_split, prepare
from backend.data.photos import DATABASE, DISTORTED, _forget_other_photos, list_photos, reconstruct, similarity
from backend.service.limits import Limits
from backend.tools import cli
from blender_addon.core.colmap import UNDISTORTED
from blender_addon.core.errors import SplatwrightError
from helpers import ROOT, simple_radial_capture

pycolmap = pytest.importorskip("pycolmap", reason="pycolmap is not installed (pyproject.toml's dependencies have it)")

SKULL = Path(__file__).resolve().parent / "data" / "colmap_skull"
CHECK = Limits().check


# Skull photos that register together, for a quick check of the dataset written (all 65 take minutes:
# bench/results/photos-skull-20261206-sfm.md).
OVERLAPPING = ["35", "36", "37", "38", "39", "47", "48", "49", "50", "53", "54", "55", "56", "64", "65", "66"]


def reconstructed(photos: Path, out: Path, **options):
    started = time.monotonic()
    result = reconstruct(photos, out, CHECK, **options)
    print(f"\n{photos.name}: {result.registered} of {result.photos} registered, {result.points} points, stages "
          f"{result.seconds}, {time.monotonic() - started:.1f} s in all")
    return result


@pytest.fixture(scope="module")
def skull(tmp_path_factory):
    """Those photos through `photos`."""
    photos = tmp_path_factory.mktemp("overlapping")
    for name in OVERLAPPING:
        shutil.copy(SKULL / "images" / f"{name}.jpg", photos)
    # At their own size: twice it (small photos' features) takes minutes, and the slow test below does it.
    return reconstructed(photos, tmp_path_factory.mktemp("skull"), max_image_size=534)


@pytest.fixture(scope="module")
def skull_photos(tmp_path_factory):
    """All 65 photos as shipped: 534x356, without EXIF (so without a focal length)."""
    return reconstructed(SKULL / "images", tmp_path_factory.mktemp("skull_all"))


def centres_and_rotations(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    cameras, names = colmap.load_cameras(root)
    return {name: (cam.position, cam.c2w[:3, :3]) for cam, name in zip(cameras, names)}


def check_against_the_shipped_model(result) -> None:
    """Median rotation error at most 1 degree and every camera centre within 2% of the scene's extent (of the
    shipped model's 65 camera centres) after a similarity alignment of the centres."""
    ours, shipped = centres_and_rotations(result.folder), centres_and_rotations(SKULL)
    common = sorted(ours.keys() & shipped.keys())
    assert len(common) == result.registered
    source = np.array([ours[n][0] for n in common])
    target = np.array([shipped[n][0] for n in common])
    scale, rotation, shift = similarity(source, target)
    centre_error = np.linalg.norm(scale * source @ rotation.T + shift - target, axis=1)
    every = np.array([position for position, _ in shipped.values()])
    extent = np.linalg.norm(every.max(axis=0) - every.min(axis=0))
    angles = [np.degrees(np.arccos(np.clip((np.trace((rotation @ ours[n][1]).T @ shipped[n][1]) - 1) / 2, -1, 1)))
              for n in common]
    print(f"\nmedian rotation error {np.median(angles):.3f} deg (max {max(angles):.3f}), camera centres "
          f"median {np.median(centre_error) / extent:.4%} max {centre_error.max() / extent:.4%} of the extent")
    assert np.median(angles) <= 1.0
    assert centre_error.max() <= 0.02 * extent


@pytest.mark.slow
def test_all_the_skulls_photos_register_where_the_shipped_model_has_them(skull_photos):
    """Found features on at twice their size, their camera calibrating itself (they have no EXIF)."""
    assert skull_photos.registered >= 60, skull_photos
    check_against_the_shipped_model(skull_photos)
    camera, = pycolmap.Reconstruction(str(skull_photos.folder / DISTORTED / "sparse" / "0")).cameras.values()
    shipped, = pycolmap.Reconstruction(str(SKULL / "sparse")).cameras.values()
    assert (camera.width, camera.height) == (534, 356)  # the features' positions scaled back to the photos
    assert abs(camera.focal_length / shipped.mean_focal_length() - 1) < 0.05, camera


def test_the_dataset_written_loads_every_registered_photo(skull):
    assert skull.registered >= 12, skull
    train, test = load_split(skull.folder, "train"), load_split(skull.folder, "test")
    assert len(train.cameras) + len(test.cameras) == skull.registered
    assert len(colmap.read_points(skull.folder)[0]) == skull.points > 200



def test_other_photos_start_a_new_database(skull, tmp_path):
    """The same output folder again on 12 of its 16 photos: those are mapped, not the 16 the database holds."""
    out = tmp_path / "out"
    shutil.copytree(skull.folder, out)
    photos = tmp_path / "fewer"
    photos.mkdir()
    for name in OVERLAPPING[:12]:
        shutil.copy(SKULL / "images" / f"{name}.jpg", photos)
    again = reconstruct(photos, out, CHECK)
    assert again.photos == 12 and 3 <= again.registered <= 12, again
    assert set(colmap.load_cameras(out)[1]) <= set(OVERLAPPING[:12])


def test_a_photo_of_other_bytes_under_its_name_forgets_the_database(tmp_path):
    folder, out = tmp_path / "photos", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    for name in OVERLAPPING[:3]:
        shutil.copy(SKULL / "images" / f"{name}.jpg", folder)
    photos = list_photos(folder, CHECK)
    database = out / DATABASE
    _forget_other_photos(out, folder, photos)
    database.write_bytes(b"features")
    _forget_other_photos(out, folder, photos)  # the same photos: kept
    assert database.read_bytes() == b"features"
    shutil.copy(SKULL / "images" / "01.jpg", folder / f"{OVERLAPPING[0]}.jpg")
    _forget_other_photos(out, folder, photos)
    assert not database.exists()


def test_a_simple_radial_model_loads_after_undistortion(tmp_path):
    """The skull's model with its camera made SIMPLE_RADIAL (a small k), beside the photos, as `colmap mapper`
    leaves a capture: training reads the undistorted copy the loader makes, once."""
    capture = simple_radial_capture(tmp_path / "capture")
    assert {cam.model for cam in colmap.read_model(colmap.find_model(capture)).cameras.values()} == {"SIMPLE_RADIAL"}
    note = prepare(capture)
    assert "SIMPLE_RADIAL" in note and str(capture / UNDISTORTED) in note
    assert prepare(capture) is None  # made once
    train, test = load_split(capture, "train"), load_split(capture, "test")
    assert len(train.cameras) + len(test.cameras) == 65
    undistorted = colmap.read_model(colmap.find_model(capture / UNDISTORTED))
    assert {cam.model for cam in undistorted.cameras.values()} == {"PINHOLE"}
    assert sorted(p.name for p in (capture / UNDISTORTED).iterdir()) == ["images", "sparse"]


def test_a_simple_radial_capture_trains_on_the_command_line_and_undistorts_alone(tmp_path, capsys):
    """`train` on the SIMPLE_RADIAL capture undistorts it as it starts and trains; `python -m backend.data`, what
    the add-on runs where Blender's Python has no pycolmap, makes the same copy and prints where it is."""
    capture = simple_radial_capture(tmp_path / "capture")
    assert cli.main(["train", str(capture), "--out", str(tmp_path / "trained"), "--device", "cpu", "--iterations", "3",
                     "--downscale", "8"]) == 0
    assert "undistorted to pinhole cameras" in capsys.readouterr().err
    metrics = json.loads((tmp_path / "trained" / "metrics.json").read_text())
    assert metrics["iterations"] == 3 and np.isfinite(metrics["psnr"])
    again = simple_radial_capture(tmp_path / "again")
    done = subprocess.run([sys.executable, "-m", "backend.data", str(again)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(again / UNDISTORTED)
    assert {cam.model for cam in colmap.read_model(colmap.find_model(again / UNDISTORTED)).cameras.values()} == {
        "PINHOLE"}


def unrelated_photos(folder: Path, count: int) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


def test_too_few_registered_photos_say_how_many_and_why(tmp_path):
    photos = unrelated_photos(tmp_path / "photos", 2)
    with pytest.raises(SplatwrightError, match=r"registered \d of 2 photos.*overlap too little or are blurred"):
        reconstruct(photos, tmp_path / "out", CHECK)


def test_the_command_reports_too_few_photos_in_one_line(tmp_path, capsys):
    photos = unrelated_photos(tmp_path / "photos", 2)
    assert cli.main(["photos", str(photos), "--out", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ") and "of 2 photos" in error
    assert (tmp_path / "out" / "database.db").is_file()  # kept for a second run


def test_photos_go_through_the_upload_limits(tmp_path, capsys):
    photos = unrelated_photos(tmp_path / "photos", 3)
    with pytest.raises(SplatwrightError, match="--max-views"):
        reconstruct(photos, tmp_path / "out", Limits(views=2).check)
    assert cli.main(["photos", str(photos), "--out", str(tmp_path / "out"), "--max-view-pixels", "100"]) == 1
    assert "run photos with --max-view-pixels N to allow more" in capsys.readouterr().err

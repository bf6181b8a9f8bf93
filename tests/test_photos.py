"""Structure from motion from a folder of photos (backend/data/photos.py, through pycolmap): 24 of the skull's photos
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
from backend.data.photos import DATABASE, DISTORTED, _forget_other_photos, list_photos, reconstruct
from backend.service.limits import Limits
from backend.tools import cli
from backend.tools.bench import photos as photos_bench
from blender_addon.core.colmap import UNDISTORTED
from blender_addon.core.errors import SplatwrightError
from helpers import ROOT, simple_radial_capture

pycolmap = pytest.importorskip("pycolmap", reason="pycolmap is not installed (pyproject.toml's dependencies have it)")

SKULL = Path(__file__).resolve().parent / "data" / "colmap_skull"
CHECK = Limits().check


# 24 neighbouring skull photos: they register together in a fraction of the time all 65 take (python -m backend
# bench photos --data tests/data/colmap_skull measures those).
OVERLAPPING = [str(n) for n in range(35, 59)]
FEWER = ["35", "36", "37", "38", "39", "47", "48", "49", "50", "53", "54", "55"]  # 12 of them that register alone


def reconstructed(photos: Path, out: Path, **options):
    started = time.monotonic()
    result = reconstruct(photos, out, CHECK, **options)
    print(f"\n{photos.name}: {result.registered} of {result.photos} registered, {result.points} points, stages "
          f"{result.seconds}, {time.monotonic() - started:.1f} s in all")
    return result


@pytest.fixture(scope="module")
def skull(tmp_path_factory):
    """Those photos through `photos` with its defaults: 534x356 without EXIF (so without a focal length), their
    features found at twice their size, their camera calibrating itself."""
    photos = tmp_path_factory.mktemp("overlapping")
    for name in OVERLAPPING:
        shutil.copy(SKULL / "images" / f"{name}.jpg", photos)
    return reconstructed(photos, tmp_path_factory.mktemp("skull"))


def test_the_skulls_photos_register_where_the_shipped_model_has_them(skull):
    """The bench's bars for rotations and camera centres against the shipped model; the focal length, less
    certain from these photos alone (it trades against the radial distortion over their narrow view: 4-6% off in
    some runs), within 10%."""
    assert skull.registered >= 22, skull
    agreed = photos_bench.agreement(skull.folder, SKULL)
    print(f"\n{agreed}")
    passed = photos_bench.bars(len(OVERLAPPING), skull.registered, agreed)
    assert agreed["common"] == skull.registered and passed["rotation"] and passed["centres"], agreed
    assert abs(agreed["focal_error"]) < 0.1, agreed
    camera, = pycolmap.Reconstruction(str(skull.folder / DISTORTED / "sparse" / "0")).cameras.values()
    assert (camera.width, camera.height) == (534, 356)  # the features' positions scaled back to the photos


def test_the_dataset_written_loads_every_registered_photo(skull):
    assert skull.registered >= 12, skull
    train, test = load_split(skull.folder, "train"), load_split(skull.folder, "test")
    assert len(train.cameras) + len(test.cameras) == skull.registered
    assert len(colmap.read_points(skull.folder)[0]) == skull.points > 200



def test_other_photos_start_a_new_database(skull, tmp_path):
    """The same output folder again on 12 of its 24 photos: those are mapped, not the 24 the database holds."""
    out = tmp_path / "out"
    shutil.copytree(skull.folder, out)
    photos = tmp_path / "fewer"
    photos.mkdir()
    for name in FEWER:
        shutil.copy(SKULL / "images" / f"{name}.jpg", photos)
    again = reconstruct(photos, out, CHECK)
    assert again.photos == 12 and 3 <= again.registered <= 12, again
    assert set(colmap.load_cameras(out)[1]) <= set(FEWER)


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

"""Make Cameras from Photos in real Blender: tests/blender/scenarios/photos.py in the bpy module of Blender 4.5 and
5.3, with a CPU backend started by the add-on, on 16 of the skull's photos (tests/data/colmap_skull), which
register together in seconds, and 4 photos of noise, which cannot register."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import build_addon
from blender.runner import SCENARIOS, run_scenario
from helpers import ROOT

pytestmark = pytest.mark.blender

SKULL = ROOT / "tests" / "data" / "colmap_skull" / "images"
OVERLAPPING = ["35", "36", "37", "38", "39", "47", "48", "49", "50", "53", "54", "55", "56", "64", "65", "66"]


@pytest.fixture(scope="module", params=["4.5", "5.3"])
def scenario(request, tmp_path_factory) -> dict:
    pytest.importorskip("pycolmap", reason="the backend's structure from motion needs pycolmap")
    home = tmp_path_factory.mktemp(f"photos-{request.param}")
    photos = home / "skull16"
    photos.mkdir()
    for name in OVERLAPPING:
        shutil.copy(SKULL / f"{name}.jpg", photos)
    noise = home / "noise"
    noise.mkdir()
    rng = np.random.default_rng(1)
    for index in range(4):
        Image.fromarray(rng.integers(0, 256, (96, 128, 3), np.uint8)).save(noise / f"{index}.png")
    return run_scenario(SCENARIOS / "photos.py", home, "--zip", str(build_addon.build(home / "dist")),
                        "--out", str(home / "out"), "--photos", str(photos), "--noise", str(noise),
                        "--python", sys.executable,
                        timeout=400, blender=request.param)


def test_the_photos_come_in_as_cameras_and_points(scenario):
    assert scenario["error"] == "" and scenario["source"] == "PHOTOS"
    assert re.fullmatch(r"COLMAP photos-skull16-[0-9a-f]{8}", scenario["empty"])
    made = [line for line in scenario["reports"] if "skull16: registered" in line]
    assert len(made) == 1 and "of 16 photos" in made[0] and "imported" in made[0], scenario["reports"]
    train, test = scenario["counts"]
    assert scenario["cameras"] == train + test >= 12 and scenario["points"] > 300


def test_the_panel_and_the_status_bar_show_the_progress(scenario):
    bar = scenario["status_bar"]
    assert any(text.startswith("Photos: Features ") for text in bar), bar
    assert any(text.startswith("Photos: Registered ") for text in bar), bar
    drawn = [text for texts in scenario["panel"] for text in texts]
    assert any(text.startswith("[") and "Features " in text for text in drawn)  # a progress bar in the panel
    assert "Make Cameras from Photos" not in drawn  # the button gives way to the progress and Cancel


def test_the_photos_train(scenario):
    status = scenario["status"]
    assert scenario["trained_error"] == "" and status["state"] == "finished" and status["step"] == 20
    assert status["views"] == scenario["counts"][0]


def test_photos_that_do_not_register_end_with_an_error_report(scenario):
    got = scenario["unregistered"]
    errors = [line for line in got["reports"] if line.startswith("Error: ")]
    assert len(errors) == 1 and "registered 0 of 4 photos, too few to train on" in errors[0], got["reports"]
    assert "too few to train on" in got["error"]  # the panels show it too
    assert got["active"] == scenario["empty"]  # nothing else came in


def test_a_remote_backend_gets_the_photos_uploaded_and_sends_the_cameras_back(scenario):
    got = scenario["remote"]
    assert got["error"] == "" and got["empty"].startswith(scenario["empty"] + ".")  # a second import beside the first
    photos = Path(got["photos"])  # fetched into the add-on's captures folder (the .blend is unsaved)
    assert photos.parts[-3] == "captures" and photos.parts[-2].startswith("photos-skull16-")
    assert photos.parts[-1] == "images" and ".reconstructions" not in photos.parts
    assert got["cameras"] == scenario["cameras"] and len(list(photos.iterdir())) == got["cameras"]


def test_the_main_thread_never_waits(scenario):
    assert {"op:reconstruct", "op:capture_train", "timer:poll", "timer:advance_photos"} <= set(scenario["calls"])
    assert scenario["timer_calls"] > 20
    print(f"status bar: {scenario['status_bar']}")
    assert scenario["blocking"] == []  # no socket I/O, thread, condition, process or sleep

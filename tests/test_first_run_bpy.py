"""A new user's path from Blender's startup scene to a trained model drawn in the viewport, pressing only the
main panel's main button (tests/blender/scenarios/first_run.py, the bpy 4.5 module, a real CPU backend): at most
three presses, at most six settings always in sight, and the time left the panel shows after a tenth of the steps
following the measured step rate. How close it comes is a timing on a shared machine: the test prints it (19%
measured, the bar 30%) and fails only at a factor of 3, which a time left still on the table's prior misses by
on a machine slower than the table's."""
from __future__ import annotations

import sys

import pytest

from blender.runner import SCENARIOS, run_scenario
from blender_addon.logic.eta import error_at_a_tenth

pytestmark = pytest.mark.blender

SCENARIO = SCENARIOS / "first_run.py"
MAX_CLICKS = 3
MAX_SETTINGS = 6
ETA_FACTOR = 3.0  # see the module's docstring


@pytest.fixture(scope="module")
def first_run(addon_zip, tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("blender-first-run")
    return run_scenario(SCENARIO, home, "--zip", str(addon_zip), "--out", str(home / "out"), "--python",
                        sys.executable, timeout=1200, blender="4.5")


def test_three_presses_of_the_main_button_make_a_model_in_the_viewport(first_run):
    print(f"presses: {first_run['clicks']}")
    assert first_run["shown"], first_run
    assert first_run["status"]["state"] == "finished"
    assert len(first_run["clicks"]) <= MAX_CLICKS, first_run["clicks"]
    assert first_run["clicks"][0] == "splatwright.capture_train"
    assert first_run["last_error"] == ""


def test_the_main_panel_shows_few_settings(first_run):
    print(f"settings always in the main panel: {first_run['main_panel_settings']}")
    assert len(first_run["main_panel_settings"]) <= MAX_SETTINGS, first_run["main_panel_settings"]


def test_an_unsaved_files_captures_go_to_the_data_folder(first_run):
    folder = first_run["capture_folder"]
    assert "/config/splatwright/captures/" in folder.replace("\\", "/")


def test_the_time_left_after_a_tenth_of_the_steps_follows_the_measured_rate(first_run):
    shown, actual, error = error_at_a_tenth(first_run["eta"])
    print(f"time left at 10%: shown {shown:.1f} s, took {actual:.1f} s, error {100 * error:.0f}%")
    assert actual / ETA_FACTOR <= shown <= actual * ETA_FACTOR, (shown, actual)

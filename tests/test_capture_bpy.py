"""Captures that cannot run fail before anything is made, one that stores no view leaves nothing, the splats
engine captures with Cycles, and the settings follow the backend's device: tests/blender/scenarios/capture.py in
the bpy module of each Blender version tested, checked here."""
from __future__ import annotations

import pytest

import build_addon
from blender_addon.logic.defaults import DEVICE_DEFAULTS
from blender.runner import BLENDERS, SCENARIOS, run_scenario

pytestmark = pytest.mark.blender

SCENARIO = SCENARIOS / "capture.py"


@pytest.fixture(scope="module", params=BLENDERS)
def scenario(request, tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("capture")
    addon_zip = build_addon.build(home / "dist")
    return run_scenario(SCENARIO, home, "--zip", str(addon_zip), "--out", str(home / "out"), timeout=300,
                        blender=request.param)


def test_captures_that_cannot_run_fail_before_anything_is_made(scenario):
    r = scenario["refusals"]
    for case, words in (("ORTHO", "orthographic"), ("PANO", "panoramic"), ("no_camera", "no active camera"),
                        ("no_camera_objects", "no camera objects")):
        assert r[case]["returned"] == ["CANCELLED"], case
        assert words in r[case]["report"] and "\n" not in r[case]["report"].strip(), r[case]["report"]
        assert r[case]["folders"] == [], case  # no dataset folder
    assert r["requests_after_refusals"] == []  # no session opened, nothing sent


def test_a_capture_that_stores_no_view_leaves_no_folder_or_session(scenario):
    r = scenario["refusals"]["first_view_fails"]
    assert r["returned"] == ["CANCELLED"] and "r_000 was not written" in r["report"], r
    assert r["folders"] == []  # its initial points and split folders removed with it
    assert scenario["refusals"]["requests_after_refusals"] == []  # no session opened


def test_the_splats_engine_captures_with_cycles_and_is_restored(scenario):
    r = scenario["refusals"]
    assert r["splats_engine"]["returned"] == ["FINISHED"] and len(r["splats_engine"]["folders"]) == 1
    assert r["engine_after"] == "SPLATWRIGHT"
    assert r["pngs"] == ["r_000.png", "r_001.png"]
    assert r["requests"] == ["open_session", "set_points", "add_view", "add_view"]


def test_settings_follow_the_backends_device_until_the_user_changes_them(scenario):
    d = scenario["device_defaults"]
    assert d["start"] == DEVICE_DEFAULTS["cuda"]
    assert d["unconnected"] == DEVICE_DEFAULTS[d["machine_device"]]
    assert d["cpu"] == DEVICE_DEFAULTS["cpu"] and d["new_scene"] == DEVICE_DEFAULTS["cpu"]
    assert d["gpu_again"] == DEVICE_DEFAULTS["cuda"]
    assert d["changed_kept"] == {"orbit_count": 24, "samples": DEVICE_DEFAULTS["cuda"]["samples"]}
    assert d["adopted_twice"] is False


def test_no_deprecation_warnings_from_the_capture(scenario):
    assert "deprecat" not in scenario["stderr"].lower(), scenario["stderr"][-2000:]

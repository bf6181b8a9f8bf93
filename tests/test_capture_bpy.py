"""Captures that cannot run fail before anything is made, the splats engine captures with Cycles, and the
settings follow the backend's device: tests/blender_capture_scenario.py in the bpy module (4.5, and 5.0 where
.venv-bpy5 holds it), checked here."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import build_addon
from blender_addon.defaults import DEVICE_DEFAULTS

pytestmark = pytest.mark.blender

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "tests" / "blender_capture_scenario.py"
BPY5_PYTHON = REPO / ".venv-bpy5" / "bin" / "python"


def interpreters() -> list:
    found = [pytest.param(sys.executable, id="bpy-4.5")]
    found.append(pytest.param(str(BPY5_PYTHON), id="bpy-5.0", marks=pytest.mark.skipif(
        not BPY5_PYTHON.is_file(), reason=f"{BPY5_PYTHON} (bpy 5.0.1) is not there")))
    return found


@pytest.fixture(scope="module", params=interpreters())
def scenario(request, tmp_path_factory) -> dict:
    python = request.param
    if python == sys.executable and importlib.util.find_spec("bpy") is None:
        pytest.skip("the bpy module (pip install bpy==4.5.*) is not installed")
    home = tmp_path_factory.mktemp("capture")
    addon_zip = build_addon.build(home / "dist")
    env = {**os.environ, "BLENDER_USER_SCRIPTS": str(home / "scripts"), "BLENDER_USER_CONFIG": str(home / "config"),
           "BLENDER_USER_EXTENSIONS": str(home / "extensions")}
    run = subprocess.run([python, str(SCENARIO), "--zip", str(addon_zip), "--out", str(home / "out")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=home)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no result (exit code {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert "failure" not in result, result.get("traceback")
    return {**result, "stderr": run.stderr}


def test_captures_that_cannot_run_fail_before_anything_is_made(scenario):
    r = scenario["refusals"]
    for case, words in (("ORTHO", "orthographic"), ("PANO", "panoramic"), ("no_camera", "no active camera"),
                        ("no_camera_objects", "no camera objects")):
        assert r[case]["returned"] == ["CANCELLED"], case
        assert words in r[case]["report"] and "\n" not in r[case]["report"].strip(), r[case]["report"]
        assert r[case]["folders"] == [], case  # no dataset folder
    assert r["requests_after_refusals"] == []  # no session opened, nothing sent


def test_the_splats_engine_captures_with_cycles_and_is_restored(scenario):
    r = scenario["refusals"]
    assert r["splats_engine"]["returned"] == ["FINISHED"] and len(r["splats_engine"]["folders"]) == 1
    assert r["engine_after"] == "SPLATWRIGHT"
    assert r["pngs"] == ["r_000.png", "r_001.png"]
    assert r["requests"] == ["open_session", "set_points", "add_view", "add_view"]


def test_settings_follow_the_backends_device_until_the_user_changes_them(scenario):
    d = scenario["device_defaults"]
    assert d["start"] == DEVICE_DEFAULTS["cuda"]
    assert d["cpu"] == DEVICE_DEFAULTS["cpu"] and d["new_scene"] == DEVICE_DEFAULTS["cpu"]
    assert d["gpu_again"] == DEVICE_DEFAULTS["cuda"]
    assert d["changed_kept"] == {"orbit_count": 24, "samples": DEVICE_DEFAULTS["cuda"]["samples"]}
    assert d["adopted_twice"] is False


def test_no_deprecation_warnings_from_the_capture(scenario):
    assert "deprecat" not in scenario["stderr"].lower(), scenario["stderr"][-2000:]

"""The add-on from nothing but its zip, as a new user gets it: copied alone into an empty folder, installed into
fresh Blender user folders (bpy 4.5 as a legacy add-on, bpy 5.2 and 5.3 as an extension), its backend set up
from the preferences (from the package index pip is configured with), started from the installed add-on, a
capture and a short training. Nothing the add-on or its backend uses may lie in this checkout.

The set-up (a venv and torch) takes about a minute: it runs once, in the 4.5 case, and the 5.x cases choose
the environment it made, as a user who has one would."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import build_addon
from blender.runner import BLENDERS, REPO, SCENARIOS, run_scenario

INSTALL_SCENARIO = SCENARIOS / "install.py"

pytestmark = [pytest.mark.slow, pytest.mark.blender]


@pytest.fixture(scope="module")
def lone_zip(tmp_path_factory) -> Path:
    built = build_addon.build(tmp_path_factory.mktemp("dist"))
    return Path(shutil.copy2(built, tmp_path_factory.mktemp("download")))


@pytest.fixture(scope="module")
def legacy(lone_zip, tmp_path_factory) -> dict:
    """bpy 4.5, the zip installed as a legacy add-on, its backend set up in Blender's user config folder."""
    home = tmp_path_factory.mktemp("user-4.5")
    return {"home": home, **run_scenario(INSTALL_SCENARIO, home, "--zip", str(lone_zip), "--install", "legacy",
                                         "--out", str(home / "out"), timeout=1500)}


@pytest.fixture(scope="module", params=[b for b in BLENDERS if b != "4.5"])  # 4.5: the legacy case
def extension(lone_zip, legacy, tmp_path_factory, request) -> dict:
    """bpy 5.x, the zip installed as an extension, running the backend with the environment the 4.5 case made."""
    home = tmp_path_factory.mktemp(f"user-{request.param}")
    python = legacy["addon"]["python"]
    return {"home": home, **run_scenario(INSTALL_SCENARIO, home, "--zip", str(lone_zip), "--install", "extension",
                                         "--out", str(home / "out"), "--python", python, timeout=600,
                                         blender=request.param)}


def outside_the_checkout(result: dict) -> None:
    """Every path the add-on and its running backend use lies outside this checkout."""
    backend = result["backend"]
    paths = [*result["addon"].values(), backend["cwd"], backend["cmdline"][0], backend["pythonpath"],
             *backend["mapped_files"], result["dataset"], result["session_folder"]]
    inside = [p for p in paths if Path(p).resolve().is_relative_to(REPO)]
    assert inside == [], inside


def backend_runs_the_bundled_sources(result: dict) -> None:
    addon, backend = result["addon"], result["backend"]
    sources = Path(addon["file"]).parent / "backend_src"
    assert Path(addon["sources"]) == sources
    assert Path(backend["cwd"]) == sources and backend["pythonpath"] == str(sources)
    assert backend["cmdline"][:4] == [addon["python"], "-u", "-m", "backend.service"]
    venv = Path(addon["python"]).parent.parent
    assert any(Path(f).is_relative_to(venv) and "torch" in f for f in backend["mapped_files"])  # its torch
    assert backend["cmdline"][backend["cmdline"].index("--workdir") + 1] == addon["workdir"]
    assert Path(addon["workdir"]) == Path(addon["data_folder"]) / "sessions"
    assert Path(result["session_folder"]).parent == Path(addon["workdir"])
    assert result["capabilities"]["device"] == "cpu" and result["capabilities"]["torch"].startswith("2.13.0")


def trains(result: dict) -> None:
    assert result["capture"] == ["FINISHED"]
    status = result["status"]
    assert status["state"] == "finished" and status["step"] == status["iterations"] == 20 and status["views"] == 6
    assert result["errors"] == ""
    assert result["addon_warnings"] == []


def test_legacy_install_sets_up_its_backend_in_the_user_folder(legacy):
    setup = legacy["setup"]
    data = legacy["home"] / "config" / "splatwright"
    assert Path(legacy["addon"]["data_folder"]) == data
    assert Path(setup["venv"]) == data / "venv" and Path(legacy["addon"]["python"]) == data / "venv" / "bin" / "python"
    assert setup["state"] == "done", setup["log"][-20:]
    assert setup["found"]["torch"].startswith("2.13.0") and setup["found"]["cuda"] is None
    assert set(setup["found"]["packages"]) == {"numpy", "ninja", "plyfile", "pillow", "pycolmap", "zstandard"}
    assert "no NVIDIA driver answered nvidia-smi: installing torch's CPU build" in "\n".join(setup["log"])
    assert (data / "setup.log").read_text().splitlines()[-1] == "set-up done"
    # the preferences show the progress and the log while it runs, then what it installed
    assert any(t.startswith("[") and "Installing" in t for t in setup["drawn_running"]), setup["drawn_running"]
    assert any(t.startswith("Ready: Python 3.11") and "CPU" in t for t in setup["drawn_done"])
    assert "set-up done" in setup["drawn_done"]


def test_the_backend_environment_set_up_reads_spz_version_4(legacy):
    """SPZ version 4 is zstd-compressed: the environment Set Up Backend made reads it with the bundled sources."""
    addon = legacy["addon"]
    read = "import sys; from backend.formats import read_any; print(len(read_any(sys.argv[1])))"
    r = subprocess.run([addon["python"], "-c", read, str(REPO / "tests" / "data" / "splats" / "sh3-v4.spz")],
                       cwd=addon["sources"], env={**os.environ, "PYTHONPATH": addon["sources"]}, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split()[-1:] == ["500"], r.stderr[-2000:]


def test_legacy_set_up_cancels_and_reruns_safely(legacy):
    setup = legacy["setup"]
    cancelled = setup["cancelled"]
    assert cancelled["state"] == "cancelled" and cancelled["installer_exit"] == -9  # pip was killed
    assert "set-up cancelled" in cancelled["drawn"]
    again = setup["again"]  # a complete environment is only checked again
    assert again["state"] == "done" and again["steps"] == 1 and any("was set up before" in x for x in again["log"])


def test_legacy_install_trains_with_nothing_from_the_checkout(legacy):
    backend_runs_the_bundled_sources(legacy)
    trains(legacy)
    outside_the_checkout(legacy)


def test_extension_install_trains_with_an_environment_the_user_has(extension, legacy):
    assert extension["package"] == "bl_ext.user_default.splatwright"
    data = extension["home"] / "extensions" / ".user" / "user_default" / "splatwright"
    assert Path(extension["addon"]["data_folder"]) == data
    assert extension["addon"]["python"] == legacy["addon"]["python"]
    backend_runs_the_bundled_sources(extension)
    trains(extension)
    outside_the_checkout(extension)

"""A new user with nothing but the add-on's zip, in real Blender (the bpy module): install it (as a legacy
add-on, or as an extension of the user repository), set up the backend's environment from the preferences
(cancelled once mid-way, then again to the end, then once more, which only checks it) or choose an
environment that is there, start the backend from the installed add-on, capture a tiny scene and train a few
steps. Reports every path the add-on and its backend use, and the add-on's own warnings, for pytest to check.
Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/install.py --zip Z --install legacy|extension --out DIR \
        [--python PY]
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

import bpy

from blender.kit import addon, build_scene, draw_everything, op, report, wait_for

SETUP_TIMEOUT = 900.0  # creating the venv and installing torch from pip's index


def install(zip_path: Path, how: str) -> None:
    if how == "legacy":
        bpy.ops.preferences.addon_install(filepath=str(zip_path))
        bpy.ops.preferences.addon_enable(module="splatwright")
    else:
        bpy.ops.extensions.package_install_files(filepath=str(zip_path), repo="user_default",
                                                 enable_on_install=True)


def set_up(live) -> dict:
    """Set Up Backend: cancelled while it installs torch, run again to the end, then once more."""
    op("setup_backend")
    first = live.setup
    wait_for(lambda: first.step.startswith("Installing torch") and not first.log.last(1)[0].startswith("=="),
             "pip installs torch", 120)
    installer = first.process
    op("setup_cancel")
    wait_for(lambda: first.returncode is not None, "the set-up stops", 30)
    cancelled = {"state": first.state, "installer_exit": installer.poll(), "drawn": draw_everything()}

    op("setup_backend")
    job = live.setup
    wait_for(lambda: job.done > 0, "the set-up makes progress", 300)
    drawn_running = draw_everything()
    wait_for(lambda: job.returncode is not None, "the set-up finishes", SETUP_TIMEOUT)
    result = {"cancelled": cancelled, "drawn_running": drawn_running, "state": job.state, "found": job.found,
              "log": job.log.last(200), "venv": str(job.venv), "drawn_done": draw_everything()}

    op("setup_backend")
    again = live.setup
    wait_for(lambda: again.returncode is not None, "the set-up checks the environment", 120)
    result["again"] = {"state": again.state, "steps": again.steps, "log": again.log.last(20)}
    return result


def backend_process(pid: int) -> dict:
    """What the running backend process uses: its working folder, command line, PYTHONPATH and every file it
    mapped (the interpreter, and torch's libraries from its environment among them)."""
    proc = Path(f"/proc/{pid}")
    environ = dict(item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item)
    maps = {line.split()[-1] for line in (proc / "maps").read_text().splitlines() if line.split()[-1][:1] == "/"}
    return {"cwd": os.readlink(proc / "cwd"), "cmdline": (proc / "cmdline").read_text().split("\0")[:-1],
            "pythonpath": environ.get("PYTHONPATH"), "mapped_files": sorted(maps)}


def run(zip_path: Path, how: str, out: Path, python: str | None) -> dict:
    build_scene()
    bpy.ops.wm.save_as_mainfile(filepath=str(out / "scene.blend"))  # the dataset folder is relative to it
    install(zip_path, how)
    package = addon()
    live = package.scene.live
    prefs = bpy.context.preferences.addons[package.__name__].preferences
    result: dict = {"package": package.__name__}
    if python:
        prefs.python = python  # an environment the user already has
    else:
        result["setup"] = set_up(live)
    settings = prefs.connect_settings()
    result["addon"] = {"file": package.__file__, "data_folder": str(package.scene.addon.data_folder()),
                       "python": settings.python, "sources": settings.sources, "workdir": settings.workdir}

    op("backend_start")
    wait_for(lambda: live.backend.connection == "connected", "backend start", 180)
    result["capabilities"] = live.backend.capabilities
    result["backend"] = backend_process(live.backend.server.proc.pid)

    s = bpy.context.scene.splatwright
    s.source, s.orbit_count, s.test_every, s.point_count = "ORBIT", 6, 0, 500
    s.custom_steps, s.iterations, s.sh_degree = True, 20, 0
    result["capture"] = list(bpy.ops.splatwright.capture())
    wait_for(lambda: live.backend.status.get("views") == 6 and not live.backend.in_flight, "views sent", 300)
    op("train_start")
    wait_for(lambda: live.backend.status.get("state") == "finished", "training finishes", 300)
    result["status"] = live.backend.status
    result["dataset"] = str(Path(bpy.path.abspath(s.capture_folder)).resolve())
    result["session_folder"] = str(Path(settings.workdir, s.session).resolve())
    result["errors"] = live.backend.last_error
    op("backend_stop")
    wait_for(lambda: live.backend.connection == "disconnected" and not live.backend.in_flight, "stop")
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--install", choices=("legacy", "extension"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", help="a Python with torch for the backend, instead of setting one up")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def everything() -> dict:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = run(Path(args.zip), args.install, out, args.python)
        folder = Path(addon().__file__).parent
        result["addon_warnings"] = [f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}"
                                    for w in caught if Path(w.filename).is_relative_to(folder)]
        return result
    return report(everything)


if __name__ == "__main__":
    sys.exit(main())

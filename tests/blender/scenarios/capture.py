"""Captures that cannot run, and settings that follow the backend's device, in real Blender (the bpy module,
run by test_capture_bpy.py): Blender's startup scene, the built add-on installed as a legacy add-on, and a
stand-in for a connected backend that records every request instead of sending it. Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/capture.py --zip dist/splatwright-X.zip --out DIR
"""
from __future__ import annotations

import argparse
import faulthandler
import sys
from pathlib import Path

import bpy

from blender.kit import pump, report  # (also catches the add-on's timers)

STALL_SECONDS = 240  # under test_capture_bpy's timeout


def capture(out: Path) -> dict:
    """Run Capture Views; what it returned, the one line it reported and what it made."""
    try:
        returned, report = list(bpy.ops.splatwright.capture()), ""
    except RuntimeError as e:  # an operator's error report, raised by bpy.ops
        returned, report = ["CANCELLED"], str(e)
    folders = sorted(p.name for p in (out / "dataset").iterdir()) if (out / "dataset").is_dir() else []
    return {"returned": returned, "report": report, "folders": folders}


def refusals(addon, out: Path, requests: list) -> dict:
    scene = bpy.context.scene
    s = scene.splatwright
    s.folder, s.orbit_count, s.max_side, s.test_every, s.point_count = str(out / "dataset"), 2, 48, 0, 200
    camera = scene.camera
    result = {}
    s.source = "CAMERAS"
    for kind in ("ORTHO", "PANO"):
        camera.data.type = kind
        result[kind] = capture(out)
    camera.data.type = "PERSP"
    s.source = "ANIMATION"
    scene.camera = None
    result["no_camera"] = capture(out)
    scene.camera = camera
    bpy.data.objects.remove(camera)
    s.source = "CAMERAS"
    result["no_camera_objects"] = capture(out)
    result["first_view_fails"] = first_view_fails(addon, out)
    result["requests_after_refusals"] = list(requests)

    s.source, s.render_engine, s.samples = "ORBIT", "SCENE", 2
    scene.render.engine = "SPLATWRIGHT"  # the splats engine shows the model; the capture renders with Cycles
    result["splats_engine"] = capture(out)
    result["engine_after"] = scene.render.engine
    result["requests"] = list(requests)
    result["pngs"] = sorted(p.name for p in (out / "dataset").glob("*/train/*.png"))
    return result


def first_view_fails(addon, out: Path) -> dict:
    """A capture whose first view's image is not written (as when its render stops), with initial points."""
    scene = bpy.context.scene
    s = scene.splatwright
    s.source, s.render_engine, s.samples, s.initial_points = "ORBIT", "SCENE", 1, True
    engine, scene.render.engine = scene.render.engine, "CYCLES"
    capture_class = addon.scene.capture.Capture
    store = capture_class._store

    def unwritten(job, path):  # the render's image is gone: the capture's own check refuses the view
        path.unlink()
        store(job, path)
    capture_class._store = unwritten
    try:
        return capture(out)
    finally:
        capture_class._store = store
        scene.render.engine = engine


def device_defaults(addon, backend) -> dict:
    """The scenes' settings take the connected backend's device defaults until the user changes one, and
    before a backend connects those of the machine's likely device."""
    properties = addon.ui.properties
    s = bpy.data.scenes.new("Fresh").splatwright  # the startup scene's settings were changed above
    fields = list(addon.logic.defaults.DEVICE_DEFAULTS["cpu"])
    result = {"start": {name: getattr(s, name) for name in fields}}
    backend.connection = "disconnected"  # no backend yet: the defaults of the device one would have here
    pump()
    result["unconnected"] = {name: getattr(s, name) for name in fields}
    result["machine_device"] = addon.logic.defaults.machine_device()
    backend.connection = "connected"
    backend.capabilities = {"device": "cpu"}
    pump()
    result["cpu"] = {name: getattr(s, name) for name in fields}
    other = bpy.data.scenes.new("Later")  # a scene made while the CPU backend is connected
    pump()
    result["new_scene"] = {name: getattr(other.splatwright, name) for name in fields}
    backend.capabilities = {"device": "cuda"}
    pump()
    result["gpu_again"] = {name: getattr(s, name) for name in fields}
    s.orbit_count = 24  # the user's own choice stays
    backend.capabilities = {"device": "cpu"}
    pump()
    result["changed_kept"] = {"orbit_count": s.orbit_count, "samples": s.samples}
    result["adopted_twice"] = properties.adopt_device_defaults(other, "cpu")
    return result


def run(zip_path: Path, out: Path) -> dict:
    bpy.ops.wm.read_factory_settings()
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    addon = sys.modules["splatwright"]
    backend = addon.scene.live.backend
    requests: list[str] = []
    backend.connection = "connected"  # a stand-in: requests are recorded, none is sent
    backend.call = lambda label, fn, then=None: requests.append(label)
    result = {"blender": bpy.app.version_string, "refusals": refusals(addon, out, requests)}
    backend.capabilities = {}
    result["device_defaults"] = device_defaults(addon, backend)
    backend.connection = "disconnected"
    bpy.ops.preferences.addon_disable(module="splatwright")
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    faulthandler.dump_traceback_later(STALL_SECONDS, exit=True)  # a stall shows where it is in the test's output
    return report(lambda: run(Path(args.zip), out))


if __name__ == "__main__":
    sys.exit(main())

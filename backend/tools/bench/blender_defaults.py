"""The panel's defaults, end to end in real Blender (the bpy module): connect the add-on to a local backend, let
the scene take that device's defaults, capture and train with them and time both; on Blender's startup scene
(the cube) and on the demo's scene (backend/tools/demo_blender.py, whose wait() also runs the add-on's timers).
Run by `python -m backend bench defaults` (defaults.py); prints `RESULT <json>`, or fails with a traceback.

    python backend/tools/bench/blender_defaults.py --zip dist/splatwright-X.zip --out DIR [--scenes startup,demo]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import bpy

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, when run as a script
from backend.tools.demo_blender import build_scene, wait  # noqa: E402
from blender_addon.logic.eta import error_at_a_tenth  # noqa: E402

DEMO_SIDE = 1080  # the demo scene's square resolution, before the capture's scaling
TIMEOUT = 900.0


def settings_of(addon, scene) -> dict:
    s = scene.splatwright
    return {name: getattr(s, name) for name in addon.logic.defaults.DEVICE_DEFAULTS["cpu"]}


def capture_and_train(addon, out: Path) -> dict:
    """With the scene's settings as the device defaults left them: capture, send, train to the end."""
    live, scene = addon.scene.live, bpy.context.scene
    wait(lambda: scene.splatwright.defaults_device == addon.logic.defaults.device_of(
        live.backend.capabilities.get("device")), "the device's defaults", 10)
    scene.splatwright.folder = str(out / "dataset")
    result = {"settings": settings_of(addon, scene), "size": list(addon.scene.reading.capture_size(scene)),
              "engine": scene.render.engine}
    start = time.monotonic()
    if bpy.ops.splatwright.capture() != {"FINISHED"}:
        raise RuntimeError(f"capture failed: {live.backend.last_error}")
    wait(lambda: not live.backend.in_flight, "views sent", TIMEOUT)
    result["capture_seconds"] = time.monotonic() - start
    start = time.monotonic()
    bpy.ops.splatwright.train_start()
    eta = []  # (time, step, total, seconds left the panel shows)

    def finished() -> bool:
        b = live.backend
        eta.append((time.monotonic(), b.status.get("step", 0), b.status.get("iterations", 0),
                    b.clock.remaining(time.monotonic())))
        return b.status.get("state") == "finished"
    wait(finished, "training", TIMEOUT)
    result["train_seconds"] = time.monotonic() - start
    shown, actual, error = error_at_a_tenth(eta)
    result["eta_at_a_tenth"] = {"shown": shown, "actual": actual, "error": error}
    result["total_seconds"] = result["capture_seconds"] + result["train_seconds"]
    p = live.backend.progress
    result.update(steps=live.backend.status.get("step"), views=live.backend.status.get("views"),
                  psnr=p.get("psnr"), gaussians=p.get("gaussians"))
    return result


def run(zip_path: Path, out: Path, scenes: list[str]) -> dict:
    bpy.ops.wm.read_factory_settings()
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    addon = sys.modules["splatwright"]
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = sys.executable, str(out / "sessions")
    start = time.monotonic()
    bpy.ops.splatwright.backend_start()
    wait(lambda: addon.scene.live.backend.connection == "connected", "backend start", 600)
    result = {"blender": bpy.app.version_string, "backend_start_seconds": time.monotonic() - start,
              "device": addon.scene.live.backend.capabilities.get("device")}
    for name in scenes:
        if name == "demo":
            bpy.ops.wm.read_homefile(use_empty=True)  # the add-on stays enabled and connected
            build_scene(DEMO_SIDE)
        result[name] = capture_and_train(addon, out / name)
    bpy.ops.splatwright.backend_stop()
    wait(lambda: addon.scene.live.backend.connection == "disconnected", "backend stop", 120)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenes", default="startup,demo")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(Path(args.zip), out, args.scenes.split(","))  # a failure's traceback goes to stderr
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Make Cameras from Photos in real Blender (the bpy module), with the built zip installed: From set to Photos, a
folder of photos chosen, the one button pressed; the local backend (a CPU one, run by --python) reconstructs them
while the timers show the progress in the panel and the status bar, the cameras and points come in as Import
COLMAP brings them, and Capture & Train trains a few steps on them; photos that cannot register end with an error
report; then, the same backend reached as a remote one, the photos are uploaded and the capture made fetched back
into the captures folder. Every call on the main thread is watched for
what may block it. Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/photos.py --zip Z --out DIR --photos FOLDER --noise FOLDER \
        --python PY
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import bpy

import blender.kit as kit
from blender.kit import addon, blender_reports, draw_everything, op, report, stop_and_disable, wait_for

STEPS = 20
PHOTO_SIDE = 64  # the photos are sent this large, so the CPU trains on them in seconds


def run(zip_path: Path, out: Path, photos: Path, noise: Path, python: str) -> dict:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = python, str(out / "sessions")
    a, scene = addon(), bpy.context.scene
    live, s = a.scene.live, scene.splatwright
    s.source, s.photos_path = "PHOTOS", str(photos)
    s.max_side, s.custom_steps, s.iterations, s.sh_degree = PHOTO_SIDE, True, STEPS, 0
    result = {"drawn_before": draw_everything()}
    kit.training_window = True  # from here on, every call on the main thread is watched
    op("reconstruct")
    seen = {"status_bar": [], "panel": []}

    def made() -> bool:
        text = a.ui.statusbar.status_text()[1]
        if text and text not in seen["status_bar"]:
            seen["status_bar"].append(text)
            seen["panel"].append(draw_everything())
        return live.photos is None and live.backend.connection == "connected" and not live.backend.in_flight
    wait_for(made, "cameras made from the photos", 240)
    empty = bpy.context.view_layer.objects.active
    xyz, _ = a.scene.colmap.world_points(empty)
    result.update(seen, empty=empty.name, source=s.source, reports=list(blender_reports.lines),
                  cameras=sum(o.type == "CAMERA" for o in empty.children), points=len(xyz),
                  counts=a.scene.colmap.photo_counts(empty), error=live.backend.last_error)
    op("capture_train")
    wait_for(lambda: live.backend.status.get("state") == "finished" and not live.backend.in_flight,
             "training on the photos", 240)
    result.update(status=dict(live.backend.status), trained_error=live.backend.last_error)
    s.photos_path, start = str(noise), len(blender_reports.lines)  # photos that cannot register
    op("reconstruct")
    wait_for(lambda: live.photos is None and not live.backend.in_flight, "photos that do not register", 120)
    result["unregistered"] = {"reports": blender_reports.lines[start:], "error": live.backend.last_error,
                              "active": bpy.context.view_layer.objects.active.name}
    # The same backend reached as a remote one: the photos go up, and the capture made comes back
    server = live.backend.server
    prefs.mode, prefs.host, prefs.port, prefs.token = "REMOTE", "127.0.0.1", server.port, server.token
    kit.timed("connect as remote", lambda: live.backend.connect(prefs.connect_settings()))  # Start: it runs already
    wait_for(lambda: live.backend.connection == "connected" and not live.backend.in_flight, "connect as remote", 60)
    s.photos_path = str(photos)
    op("reconstruct")
    wait_for(made, "cameras made from the photos uploaded", 240)
    empty = bpy.context.view_layer.objects.active
    result["remote"] = {"empty": empty.name, "photos": empty["splatwright_photos"], "error": live.backend.last_error,
                        "cameras": sum(o.type == "CAMERA" for o in empty.children)}
    kit.training_window = False
    result.update(blocking=kit.waits.noted,
                  calls=sorted({c["what"] for c in kit.calls if c["training"]}),
                  timer_calls=sum(c["what"] == "timer:advance_photos" and c["training"] for c in kit.calls))
    stop_and_disable()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--photos", required=True, help="a folder of photos that register together")
    parser.add_argument("--noise", required=True, help="a folder of photos that cannot register")
    parser.add_argument("--python", required=True, help="the backend's Python (with torch and pycolmap)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: run(Path(args.zip), out, Path(args.photos), Path(args.noise), args.python))


if __name__ == "__main__":
    sys.exit(main())

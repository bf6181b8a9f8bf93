"""The add-on end to end in one process with the real bpy module (bpy can be imported once per process):
install the built zip, capture a small scene with Cycles, train on a real CPU backend through the add-on's
operators, export, view a PLY, kill and restart the backend, disable. Every timer and operator call is timed, and
each call in them that may block the main thread noted (kit.py). Prints `RESULT <json>` for pytest.

    PYTHONPATH=tests python tests/blender/scenarios/addon.py --zip dist/splatwright-X.zip --out DIR --ply P \
        --python PY
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import bpy

from blender import kit
from blender.kit import (REPO, addon, blender_reports, build_scene, calls, draw_everything, op, pump, report, timers,
                         wait_for, waits)

SCENARIO = Path(__file__).resolve()


def training() -> bool:
    """Training runs, on a trainer already set up (the backend makes it after start_training's reply)."""
    backend = addon().scene.live.backend
    return backend is not None and backend.status.get("state") == "training" and bool(backend.status.get("gaussians"))


def newest(folder: Path) -> Path:
    return max(folder.iterdir(), key=lambda p: p.stat().st_mtime_ns)


def run(zip_path: Path, out: Path, foreign_ply: Path, python: str) -> dict:
    result: dict = {}
    build_scene()
    camera_positions = {}
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    live = addon().scene.live
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = python, str(out / "sessions")

    s = bpy.context.scene.splatwright
    s.folder, s.point_count, s.test_every = str(out / "dataset"), 2000, 5
    for source, step in (("RIG_ANIMATION", 10), ("CAMERAS", 1), ("ANIMATION", 10)):  # offline: the dataset only
        s.source, s.frame_step = source, step
        result[f"capture_{source}"] = list(bpy.ops.splatwright.capture())
        result[f"dataset_{source}"] = str(newest(out / "dataset"))
    result["frame_after_capture"] = bpy.context.scene.frame_current
    scene = bpy.context.scene
    for frame in (1, 11, 21):
        scene.frame_set(frame)
        camera_positions[f"frame{frame}"] = list(scene.camera.matrix_world.translation)
    scene.frame_set(1)
    camera_positions["CamB"] = list(bpy.data.objects["CamB"].matrix_world.translation)
    result["camera_positions"] = camera_positions

    result["drawn_disconnected"] = draw_everything()

    op("backend_start")
    result["start_seconds"] = wait_for(lambda: live.backend.connection == "connected", "backend start", 120)
    result["capabilities"] = live.backend.capabilities

    offline = Path(s.capture_folder)  # the animation capture, made while no backend ran
    result["offline_points"] = (offline / "points3d.ply").is_file()
    for attempt in ("sent", "resent"):  # the second time there is nothing new to send
        op("send_views")
        wait_for(lambda: not live.backend.in_flight and live.backend.status.get("session") == offline.name,
                 f"offline capture {attempt}")
        result[f"offline_{attempt}"] = {"views": live.backend.status["views"], "session": s.session,
                                        "error": live.backend.last_error}
    result["offline_frames"] = len(json.loads((offline / "transforms_train.json").read_text())["frames"])
    result["offline_times"] = [json.loads(p.read_text()).get("time")
                               for p in sorted((out / "sessions" / offline.name / "views").glob("*.json"))]

    s.source, s.orbit_shape, s.orbit_count = "ORBIT", "HEMISPHERE", 10
    s.custom_steps, s.iterations, s.sh_degree = True, 150, 1
    start = time.perf_counter()
    result["capture"] = list(bpy.ops.splatwright.capture())
    result["capture_seconds"] = time.perf_counter() - start
    wait_for(lambda: live.backend.status.get("views") == 8 and not live.backend.in_flight, "views sent")
    result["views_sent"] = live.backend.status["views"]
    result["dataset"] = str(newest(out / "dataset"))
    result["scene_objects"] = sorted(o.name for o in bpy.context.scene.objects)  # the orbit camera is gone

    kit.training_window = True  # the calls from here on are made while training
    op("train_start")
    wait_for(training, "training starts")
    op("train_pause")
    wait_for(lambda: live.backend.status.get("state") == "paused", "pause")
    paused_step = live.backend.status["step"]
    time.sleep(0.3)
    pump()
    result["pause_held"] = live.backend.status["step"] == paused_step
    op("train_resume")
    wait_for(training, "resume")
    op("render_preview")
    op("backend_check")
    wait_for(lambda: "Splatwright Preview" in bpy.data.images, "preview image")
    wait_for(lambda: live.backend.progress.get("loss") is not None, "a progress event with a loss")
    result["drawn_training"] = draw_everything()
    wait_for(lambda: live.backend.status.get("state") == "finished", "training finishes", 150)
    kit.training_window = False
    result["final_progress"] = live.backend.progress
    result["trained_session"] = s.session
    result["sessions"] = str(out / "sessions")
    result["status"] = live.backend.status

    ply = out / "trained.ply"
    op("export_splats", filepath=str(ply))
    wait_for(lambda: ply.is_file() and not live.backend.in_flight, "export")
    result["exported"] = str(ply)

    if foreign_ply.is_file():
        op("import_splats", filepath=str(foreign_ply))
        wait_for(lambda: not live.backend.in_flight, "load PLY")
        result["loaded_gaussians"] = live.backend.status.get("gaussians")
        bpy.data.images.remove(bpy.data.images["Splatwright Preview"])
        op("render_preview")
        wait_for(lambda: "Splatwright Preview" in bpy.data.images, "preview of the PLY")
        image = bpy.data.images["Splatwright Preview"]
        result["preview_size"] = list(image.size)
        result["preview_max"] = max(image.pixels[:])

    result["errors_before_kill"] = live.backend.last_error
    op("import_splats", filepath=str(SCENARIO))  # not a PLY: the backend refuses, the add-on reports it
    wait_for(lambda: not live.backend.in_flight, "bad PLY refused")
    result["bad_ply_error"] = live.backend.last_error
    server = live.backend.server
    op("backend_kill")
    wait_for(lambda: live.backend.connection == "disconnected", "kill")
    result["killed_exit_code"] = server.proc.wait(10)

    op("backend_start")  # a backend with no session open reopens the scene's, and its checkpoint
    wait_for(lambda: live.backend.connection == "connected" and not live.backend.in_flight, "restart after kill",
             120)
    result["reopened_after_kill"] = dict(live.backend.status)
    result["crash"] = crash_while_training(s, out)
    server = live.backend.server
    op("backend_stop")
    wait_for(lambda: live.backend.connection == "disconnected" and not live.backend.in_flight, "stop")
    result["stopped_exit_code"] = server.proc.wait(30)

    result["remote"] = try_remote(prefs, out, python)
    bpy.ops.preferences.addon_disable(module="splatwright")
    time.sleep(0.5)  # let the event and log threads see their streams close
    result["left_registered"] = [n for n in dir(bpy.types) if n.startswith("SPLATWRIGHT_")]
    result["scene_property_left"] = hasattr(bpy.types.Scene, "splatwright")
    result["timers_left"] = [fn.__name__ for fn in timers if bpy.app.timers.is_registered(fn)]
    result["threads_left"] = [t.name for t in threading.enumerate() if t.name.startswith("splatwright")]
    return result


def crash_while_training(s, out: Path) -> dict:
    """Train again from scratch, let the backend die (kill -9) once the new run has checkpointed, and start
    it: the session and its model are back by themselves, the panel showed no training in between, and Start
    Training continues from the checkpoint."""
    a = addon()
    live = a.scene.live
    result = {"asks_first": a.scene.session.has_model()}
    checkpoint = out / "sessions" / s.session / "checkpoint.pt"
    before = checkpoint.stat().st_mtime_ns
    s.iterations = 1_000_000
    op("train_start", start="OVER")
    wait_for(training, "training starts over")
    wait_for(lambda: checkpoint.stat().st_mtime_ns != before, "the new run's first checkpoint", 90)
    wait_for(lambda: live.backend.progress.get("step", 0) > 0, "a progress event of the new run")
    result["step_at_kill"] = live.backend.progress["step"]
    os.kill(live.backend.server.proc.pid, signal.SIGKILL)  # the backend dies on its own
    wait_for(lambda: live.backend.connection == "lost", "lost backend noticed")
    result["lost_detail"] = live.backend.detail
    result["capture_blocked_when_lost"] = a.ops.capture.SPLATWRIGHT_OT_capture.blocked(bpy.context)
    result["drawn_lost"] = draw_everything()
    op("backend_start")
    wait_for(lambda: live.backend.connection == "connected" and not live.backend.in_flight, "restart after loss",
             120)
    result["reopened"] = dict(live.backend.status)
    op("train_start")  # as the dialog's default, Continue From It
    wait_for(lambda: training() and live.backend.status.get("step", 0) > result["reopened"]["step"],
             "training continues")
    op("train_stop")
    wait_for(lambda: live.backend.status.get("state") == "stopped" and not live.backend.in_flight, "stop training")
    result["continued_to"] = live.backend.status["step"]
    ply = out / "continued.ply"  # the model the session's checkpoint now holds
    op("export_splats", filepath=str(ply))
    wait_for(lambda: ply.is_file() and not live.backend.in_flight, "export of the continued model")
    result["exported"] = str(ply)
    s.iterations = 150
    return result


def try_remote(prefs, out: Path, python: str) -> dict:
    """A backend someone else started, with a token: a wrong token is refused, the right one connects, and
    stopping only disconnects."""
    live = addon().scene.live
    (out / "token").write_text("remote-secret")
    server = subprocess.Popen([python, "-m", "backend", "serve", "--port", "0", "--workdir",
                               str(out / "remote"), "--token-file", str(out / "token")],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(server.stdout.readline())["port"]
        prefs.mode, prefs.host, prefs.port, prefs.token = "REMOTE", "127.0.0.1", port, "wrong"
        op("backend_start")
        wait_for(lambda: live.backend.connection != "connecting", "wrong token refused")
        refused = live.backend.detail
        prefs.token = "remote-secret"
        op("backend_start")
        wait_for(lambda: live.backend.connection == "connected", "remote connect")
        kill_blocked = addon().ops.backend.SPLATWRIGHT_OT_backend_kill.blocked(bpy.context)
        op("backend_stop")
        wait_for(lambda: live.backend.connection == "disconnected" and not live.backend.in_flight, "remote leave")
        return {"refused": refused, "kill_blocked": kill_blocked, "alive_after_stop": server.poll() is None}
    finally:
        server.terminate()
        server.wait(30)
        prefs.mode = "LOCAL"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ply", required=True, help="a third-party PLY to view (skipped where it is missing)")
    parser.add_argument("--python", required=True, help="the backend's Python (with torch)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: {**run(Path(args.zip), out, Path(args.ply), args.python), "calls": calls,
                           "blocking": waits.noted, "reports": blender_reports.lines})


if __name__ == "__main__":
    sys.exit(main())

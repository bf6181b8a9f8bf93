"""The add-on end to end in one process with the real bpy module (bpy can be imported once per process):
install the built zip, capture a small scene with Cycles, train on a real CPU backend through the add-on's
operators, export, view a PLY, kill and restart the backend, disable. Prints `RESULT <json>` for pytest.

    python tests/blender_scenario.py --zip dist/splatwright-X.zip --out DIR

bpy as a module has no event loop, so this script plays it: it calls the add-on's timers (caught as the
add-on registers them) every 20 ms and times every call, and every operator call, noting each call in them
that may block the main thread (socket I/O, waits on threads, locks' conditions, processes, sleeps).
Blender prints the reports of operators to stdout there, where this script collects them.
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
import traceback
from pathlib import Path

import bpy

from blocking_calls import BlockingCalls

SCENARIO = Path(__file__).resolve()
REPO = SCENARIO.parent.parent
timers: list = []
calls: list[dict] = []  # {"what", "seconds", "training": made between training's start and its end}
waits = BlockingCalls()  # what may have blocked the main thread in a timed call
training_window = False
_register_timer = bpy.app.timers.register
REPORT_PREFIXES = ("Info: ", "Warning: ", "Error: ")


def register_timer(function, first_interval=0.0, persistent=False):
    timers.append(function)
    return _register_timer(function, first_interval=first_interval, persistent=persistent)


bpy.app.timers.register = register_timer


class Reports:
    """Stands in for sys.stdout, which it passes everything to, and keeps the lines that are Blender's
    reports (bpy prints an operator's reports there as 'Error: ...', 'Info: ...')."""

    def __init__(self, stream):
        self.stream, self.lines, self._partial = stream, [], ""

    def write(self, text: str) -> int:
        self._partial += text
        *complete, self._partial = self._partial.split("\n")
        self.lines += [line for line in complete if line.startswith(REPORT_PREFIXES)]
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


blender_reports = Reports(sys.stdout)
sys.stdout = blender_reports


def addon():
    """The installed add-on's package, as a legacy add-on or as an extension of the user repository."""
    return sys.modules.get("splatwright") or sys.modules["bl_ext.user_default.splatwright"]


def training() -> bool:
    """Training runs, on a trainer already set up (the backend makes it after start_training's reply)."""
    backend = addon().live.backend
    return backend is not None and backend.status.get("state") == "training" and bool(backend.status.get("gaussians"))


def timed(what: str, fn):
    start = time.perf_counter()
    with waits.watch(what, training=training_window):
        result = fn()
    calls.append({"what": what, "seconds": time.perf_counter() - start, "training": training_window})
    return result


def op(name: str, **kwargs):
    return timed(f"op:{name}", lambda: getattr(bpy.ops.splatwright, name)(**kwargs))


def pump() -> None:
    for fn in timers:
        if bpy.app.timers.is_registered(fn):
            timed(f"timer:{fn.__name__}", fn)


class RecordingLayout:
    """Stands in for UILayout (bpy as a module draws nothing): checks each prop and operator exists and
    records the texts shown."""

    def __init__(self, texts: list[str]):
        self.texts = texts
        self.scale_y = 1.0

    def _nested(self, *args, **kwargs):
        return RecordingLayout(self.texts)

    row = column = box = grid_flow = _nested

    def prop(self, data, name, **kwargs):
        assert hasattr(data, name), f"no property {name!r}"

    def operator(self, idname, **kwargs):
        group, name = idname.split(".")
        assert hasattr(getattr(bpy.ops, group), name), f"no operator {idname}"

    def label(self, text="", **kwargs):
        self.texts.append(text)

    def progress(self, factor=0.0, text="", **kwargs):
        assert 0.0 <= factor <= 1.0
        self.texts.append(f"[{factor:.2f}] {text}")


class WithLayout:
    def __init__(self, target, texts):
        self._target, self.layout = target, RecordingLayout(texts)

    def __getattr__(self, name):
        return getattr(self._target, name)


def draw_everything() -> list[str]:
    """Every panel and the preferences, drawn as they would be now; returns the texts shown."""
    texts: list[str] = []
    panels = addon().panels
    for panel in panels.CLASSES:
        timed(f"draw:{panel.__name__}", lambda: panel.draw(WithLayout(None, texts), bpy.context))
    prefs = bpy.context.preferences.addons[addon().__name__].preferences
    timed("draw:preferences", lambda: type(prefs).draw(WithLayout(prefs, texts), bpy.context))
    return texts


def newest(folder: Path) -> Path:
    return max(folder.iterdir(), key=lambda p: p.stat().st_mtime_ns)


def stop_and_disable() -> None:
    """End a scenario: stop the backend, wait until nothing is in flight, disable the add-on."""
    live = addon().live
    op("backend_stop")
    wait_for(lambda: live.backend.connection == "disconnected" and not live.backend.in_flight, "stop")
    bpy.ops.preferences.addon_disable(module="splatwright")


def wait_for(condition, what: str, timeout: float = 60.0) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            backend = addon().live.backend
            raise TimeoutError(f"{what}: not within {timeout} s (connection {backend.connection}, "
                               f"{backend.detail}, status {backend.status}, last error {backend.last_error})")
        pump()
        time.sleep(0.02)
    return time.monotonic() - start


def paint(obj, name: str, rgb) -> None:
    obj.name = name
    material = bpy.data.materials.new(name)
    material.use_nodes = True
    material.node_tree.nodes["Principled BSDF"].inputs["Base Color"].default_value = (*rgb, 1.0)
    obj.data.materials.append(material)


def build_scene() -> None:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    scene.render.engine = "CYCLES"
    scene.cycles.device = "CPU"
    scene.cycles.samples = 4
    scene.cycles.use_denoising = False
    scene.render.resolution_x = scene.render.resolution_y = 64
    scene.render.resolution_percentage = 100
    bpy.ops.mesh.primitive_cube_add(size=1.0, location=(0.0, 0.0, 0.0))
    paint(bpy.context.active_object, "Box", (0.8, 0.1, 0.1))
    bpy.ops.mesh.primitive_uv_sphere_add(radius=0.5, location=(1.2, 0.4, 0.3))
    paint(bpy.context.active_object, "Ball", (0.1, 0.2, 0.8))
    sun = bpy.data.objects.new("Sun", bpy.data.lights.new("Sun", "SUN"))
    sun.rotation_euler = (0.6, 0.2, 0.4)
    scene.collection.objects.link(sun)
    for name, location in (("CamA", (5.0, -5.0, 3.0)), ("CamB", (-4.0, -5.0, 2.0))):
        cam = bpy.data.objects.new(name, bpy.data.cameras.new(name))
        cam.location = location
        cam.constraints.new("TRACK_TO").target = bpy.data.objects["Box"]
        scene.collection.objects.link(cam)
    cam = bpy.data.objects["CamA"]  # the active camera flies from A to above the scene over frames 1-21
    scene.camera, scene.frame_start, scene.frame_end = cam, 1, 21
    cam.keyframe_insert("location", frame=1)
    cam.location = (0.5, -6.0, 6.0)
    cam.keyframe_insert("location", frame=21)
    scene.frame_set(1)
    bpy.ops.object.select_all(action="DESELECT")


def run(zip_path: Path, out: Path, foreign_ply: Path) -> dict:
    global training_window
    result: dict = {}
    build_scene()
    camera_positions = {}
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    live = addon().live
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = sys.executable, str(out / "sessions")

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

    training_window = True
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
    training_window = False
    result["final_progress"] = live.backend.progress
    result["trained_session"] = s.session
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

    result["remote"] = try_remote(prefs, out)
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
    live, operators = addon().live, addon().operators
    result = {"asks_first": operators.has_model()}
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
    result["capture_blocked_when_lost"] = operators.SPLATWRIGHT_OT_capture.blocked(bpy.context)
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


def try_remote(prefs, out: Path) -> dict:
    """A backend someone else started, with a token: a wrong token is refused, the right one connects, and
    stopping only disconnects."""
    live = addon().live
    (out / "token").write_text("remote-secret")
    server = subprocess.Popen([sys.executable, "-m", "backend", "serve", "--port", "0", "--workdir",
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
        kill_blocked = addon().operators.SPLATWRIGHT_OT_backend_kill.blocked(bpy.context)
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
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: {**run(Path(args.zip), out, Path(args.ply)), "calls": calls, "blocking": waits.noted,
                           "reports": blender_reports.lines})


def report(result_of) -> int:
    """Print what `result_of()` returns, or how it failed, on the line the pytest side reads."""
    try:
        result = result_of()
    except Exception as e:
        result = {"failure": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

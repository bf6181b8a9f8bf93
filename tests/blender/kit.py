"""The in-Blender helper library of the scenarios that run in the bpy module (tests/blender/scenarios/): a
scenario imports it before it installs the add-on.

bpy as a module has no event loop, so a scenario plays it with this library: importing it catches the add-on's
timers as the add-on registers them, which pump() calls (wait_for() pumps them every 20 ms until a condition
holds). Every timer, operator (op()) and panel drawing (draw_everything()) is timed, and each call in them that
may block the main thread (socket I/O, waits on threads, locks' conditions, processes, sleeps) is noted
(blocking_calls.py). Blender prints the reports of operators to stdout there, where this library collects them
(blender_reports). A scenario ends by printing its result with report(), on the line runner.run_scenario reads;
it fails where the add-on used an API that this Blender deprecates (deprecations).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

import bpy

from blender.blocking_calls import BlockingCalls
from blender.splat_scene import build_render_scene

REPO = Path(__file__).resolve().parents[2]
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

# Blender warns of a deprecated property's use with a DeprecationWarning at the line that used it. Those from the
# add-on's files (what the scenario installed into Blender's user folders, runner.blender_env) are noted here,
# whichever way Blender called the add-on (an operator, a timer, a handler, a drawing).
ADDON_FOLDERS = [Path(os.environ[name]) for name in ("BLENDER_USER_SCRIPTS", "BLENDER_USER_EXTENSIONS")]
deprecations: list[str] = []
_show_warning = warnings.showwarning


def note_deprecation(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, DeprecationWarning) and any(Path(filename).is_relative_to(f) for f in ADDON_FOLDERS):
        deprecations.append(f"{filename}:{lineno}: {message}")
    _show_warning(message, category, filename, lineno, file, line)


warnings.filterwarnings("default", category=DeprecationWarning)  # Python shows them only in __main__ otherwise
warnings.showwarning = note_deprecation


def addon():
    """The installed add-on's package, as a legacy add-on or as an extension of the user repository."""
    return sys.modules.get("splatwright") or sys.modules["bl_ext.user_default.splatwright"]


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

    def __init__(self, texts: list[str], operators: list[str] | None = None):
        self.texts = texts
        self.operators = operators if operators is not None else []  # the buttons' operators, in order
        self.scale_y = 1.0

    def _nested(self, *args, **kwargs):
        return RecordingLayout(self.texts, self.operators)

    row = column = box = grid_flow = _nested

    def prop(self, data, name, **kwargs):
        assert hasattr(data, name), f"no property {name!r}"

    def operator(self, idname, **kwargs):
        group, name = idname.split(".")
        assert hasattr(getattr(bpy.ops, group), name), f"no operator {idname}"
        self.operators.append(idname)

    def label(self, text="", **kwargs):
        self.texts.append(text)

    def progress(self, factor=0.0, text="", **kwargs):
        assert 0.0 <= factor <= 1.0
        self.texts.append(f"[{factor:.2f}] {text}")


class WithLayout:
    def __init__(self, target, texts, operators=None):
        self._target, self.layout = target, RecordingLayout(texts, operators)

    def __getattr__(self, name):
        return getattr(self._target, name)


def draw_everything() -> list[str]:
    """Every panel and the preferences, drawn as they would be now; returns the texts shown."""
    texts: list[str] = []
    panels = addon().ui.panels
    for panel in panels.CLASSES:
        timed(f"draw:{panel.__name__}", lambda: panel.draw(WithLayout(None, texts), bpy.context))
    prefs = bpy.context.preferences.addons[addon().__name__].preferences
    timed("draw:preferences", lambda: type(prefs).draw(WithLayout(prefs, texts), bpy.context))
    return texts


def drawn_buttons() -> dict[str, list[str]]:
    """Each sidebar panel (folded ones too) as it would be drawn now: the operators of its buttons."""
    drawn: dict[str, list[str]] = {}
    for panel in addon().ui.panels.CLASSES:
        operators: list[str] = []
        panel.draw(WithLayout(None, [], operators), bpy.context)
        drawn[panel.__name__] = operators
    return drawn


def stop_and_disable() -> None:
    """End a scenario: stop the backend, wait until nothing is in flight, disable the add-on."""
    live = addon().scene.live
    op("backend_stop")
    wait_for(lambda: live.backend.connection == "disconnected" and not live.backend.in_flight, "stop")
    bpy.ops.preferences.addon_disable(module="splatwright")


def wait_for(condition, what: str, timeout: float = 60.0) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            backend = addon().scene.live.backend
            raise TimeoutError(f"{what}: not within {timeout} s (connection {backend.connection}, "
                               f"{backend.detail}, status {backend.status}, last error {backend.last_error})")
        pump()
        time.sleep(0.02)
    return time.monotonic() - start


def paint(obj, name: str, rgb) -> None:
    obj.name = name
    material = bpy.data.materials.new(name)
    if bpy.app.version < (5, 0, 0):  # from 5.0 a material always uses its nodes
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


def placed_model(zip_path: Path, workdir: Path, session: str, python: str):
    """The splat scenarios' scene for final renders (splat_scene.build_render_scene) with the add-on installed,
    its backend started on `session` and that session's model added to the scene: (scene, the add-on's live
    state, the model object)."""
    scene = build_render_scene()
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    live = addon().scene.live
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = python, str(workdir)
    scene.splatwright.session = session
    op("backend_start")  # reopens the session and its checkpoint
    wait_for(lambda: live.backend.connection == "connected" and live.backend.status.get("gaussians")
             and not live.backend.in_flight, "backend start", 120)
    op("add_model")
    wait_for(lambda: session in bpy.data.objects and not live.backend.in_flight, "Add Model to Scene")
    return scene, live, bpy.data.objects[session]


def delete_last_points(model, count: int) -> None:
    """Delete native splat object `model`'s last `count` points in Edit Mode, as a user would."""
    bpy.context.view_layer.objects.active = model
    bpy.ops.object.mode_set(mode="EDIT")
    cloud = model.data
    selection = cloud.attributes.get(".selection") or cloud.attributes.new(".selection", "BOOLEAN", "POINT")
    n = len(cloud.points)
    selection.data.foreach_set("value", [i >= n - count for i in range(n)])
    bpy.ops.pointcloud.delete()
    bpy.ops.object.mode_set(mode="OBJECT")


def report(result_of) -> int:
    """Print what `result_of()` returns, or how it failed (also where the add-on used a deprecated API), on the
    line the pytest side reads."""
    try:
        result = result_of()
        if deprecations:
            raise DeprecationWarning(f"the add-on uses what Blender {bpy.app.version_string} deprecates:\n"
                                     + "\n".join(deprecations))
    except Exception as e:
        result = {"failure": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


def session_scenario(run, *extra: str) -> int:
    """The main() of a scenario on a trained session: --zip, --workdir, --session, --out, --python and the
    `extra` options parsed, `run(zip, workdir, session, out, python, *extra values)` reported."""
    parser = argparse.ArgumentParser()
    for name in ("zip", "workdir", "session", "out", *extra):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--python", default=sys.executable, help="the backend's Python, with torch")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: run(Path(args.zip), Path(args.workdir), args.session, out, args.python,
                              *(getattr(args, name) for name in extra)))

"""Viewport composite benchmark: the main thread's cost of showing a placed splat model with the scene in a 3D
viewport, in a real Blender window at 1920x1080: Debian's Blender 3.4 under Xvfb (Mesa's software GL where there
is no GPU) with a CPU backend holding a small model. Reports p50/p95/max of the add-on's draw handler
(overlay.draw) over redraws that show the frame they had and over redraws that show a new full-size frame, of
the timer ticks that upload a new frame's strips between redraws, and how long a new frame takes from its first
strip to being shown; the bar, BAR_MS, holds for each redraw and each tick.

    python -m backend bench overlay [--gaussians 500] [--redraws 200] [--uploads 8] [--out DIR]

This file is also the script Blender runs (`blender --python backend/bench/overlay.py -- ...`). Writes
overlay-<date>-<host>.json and .md into --out (default bench/results).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # Blender runs this file as a script: the checkout's packages are not on its path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.bench.windowed import run_in_window, until  # noqa: E402

WINDOW = (1920, 1080)
BAR_MS = 5.0  # the product's bar for the main thread per redraw
SESSION = "bench-overlay"
BACKGROUND = (0.3, 0.5, 0.7)
FRAME_TIMEOUT = 300.0  # seconds for a full-size frame from the CPU backend on a loaded machine


# ---- the command: `python -m backend bench overlay` ----

def main(argv: list[str]) -> int:
    import datetime
    import os
    import platform
    import shutil
    import subprocess
    import tempfile

    import build_addon
    from . import RESULTS, ROOT, git_commit, write_results
    p = argparse.ArgumentParser(prog="python -m backend bench overlay", description=__doc__.split("\n")[0])
    p.add_argument("--gaussians", type=int, default=500)
    p.add_argument("--redraws", type=int, default=200, help="redraws that show the frame they had")
    p.add_argument("--uploads", type=int, default=8, help="redraws that upload a new full-size frame")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if not (shutil.which("blender") and shutil.which("Xvfb")):
        print("needs Debian's blender and Xvfb (apt-get install blender xvfb python3-numpy)")
        return 2
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="splatwright-bench-") as home:
        home = Path(home)
        trained_session(home / "sessions", args.gaussians)
        addon_zip = build_addon.build(home / "dist")
        env = {**os.environ, "BLENDER_USER_SCRIPTS": str(home / "scripts"), "BLENDER_USER_CONFIG": str(home / "config")}
        with xvfb() as display:
            run = subprocess.run(["blender", "--factory-startup", "-p", "0", "0", str(WINDOW[0]), str(WINDOW[1]),
                                  "--python", str(Path(__file__).resolve()), "--", "--zip", str(addon_zip),
                                  "--workdir", str(home / "sessions"), "--python", sys.executable,
                                  "--redraws", str(args.redraws), "--uploads", str(args.uploads),
                                  "--out", str(home / "out")],
                                 env={**env, "DISPLAY": display}, cwd=ROOT, capture_output=True, text=True,
                                 timeout=1800)
        result_file = home / "out" / "result.json"
        if not result_file.is_file():
            print(f"Blender wrote no result (exit code {run.returncode}):", run.stdout[-3000:], run.stderr[-3000:],
                  sep="\n")
            return 1
        result = json.loads(result_file.read_text())
    if "failure" in result:
        print(result["traceback"])
        return 1
    now = datetime.datetime.now(datetime.timezone.utc)
    result.update(benchmark="overlay", date=now.strftime("%Y-%m-%d %H:%M UTC"), commit=git_commit(),
                  gaussians=args.gaussians, bar_ms=BAR_MS, host=platform.node(), cpus=os.cpu_count(),
                  load_average=[load_before, os.getloadavg()[0]])
    rows = [f"| {label} | {result[key]['count']} | {result[key]['p50_ms']:.2f} | {result[key]['p95_ms']:.2f} | "
            f"{result[key]['max_ms']:.2f} |" for label, key in (
                ("redraw, frame already on the GPU", "draw_steady"),
                ("redraw that shows a new full-size frame", "draw_new_frame"),
                ("timer tick uploading strips of a full-size frame (between redraws)", "upload_tick"))]
    worst = max(result[key]["p95_ms"] for key in ("draw_steady", "draw_new_frame", "upload_tick"))
    report = "\n".join([
        f"Viewport composite, main thread per redraw and upload tick: {result['region'][0]}x{result['region'][1]} "
        f"region of a {WINDOW[0]}x{WINDOW[1]} window, Blender {result['blender']} ({result['gpu']}), {args.gaussians} "
        f"Gaussians on a CPU backend; commit {result['commit']}, {result['date']}, {result['cpus']} CPUs (1-minute "
        f"load average {result['load_average'][0]:.1f} before, {result['load_average'][1]:.1f} after)", "",
        "| what | count | p50 ms | p95 ms | max ms |", "|---|---|---|---|---|", *rows, "",
        f"A new full-size frame is shown {result['frame_shown']['p50_ms']:.0f} ms (p50; p95 "
        f"{result['frame_shown']['p95_ms']:.0f} ms) after its first strip went up, over "
        f"{result['upload_ticks_per_frame']:.1f} timer ticks ({result['frame_shown']['count']} frames).", "",
        f"Bar: {BAR_MS:.0f} ms of the main thread per redraw or tick; p95 {'within' if worst < BAR_MS else 'over'} it "
        f"({worst:.2f} ms)."])
    write_results(args.out, f"overlay-{now.strftime('%Y%m%d-%H%M')}-{platform.node()}", result, report)
    return 0


def trained_session(workdir: Path, gaussians: int) -> None:
    """Session SESSION in `workdir` with a checkpoint of a random model in the unit cube (serve.make_scene's)."""
    from ..gaussians import Gaussians
    from ..session import Session
    from ..train import TrainConfig, Trainer
    from .serve import make_scene
    xyz, rgb, cameras, images = make_scene(gaussians, 2, 32, 24, "cpu", "reference")
    workdir.mkdir(parents=True, exist_ok=True)
    session = Session.open(workdir, SESSION, create=True)
    for i, (cam, image) in enumerate(zip(cameras, images)):
        session.add_view(cam, image[::-1].copy(), f"view_{i}")  # make_scene's rows are bottom-up
    model = Gaussians.from_point_cloud(xyz, rgb, 0, "cpu")
    trainer = Trainer(session.dataset(BACKGROUND), TrainConfig(iterations=1, sh_degree=0, background=BACKGROUND),
                      "cpu", model)
    trainer.save_checkpoint(session.checkpoint_path)


def xvfb():
    """A context manager: an X server on a free display, named as ':N'."""
    import contextlib
    import os
    import subprocess

    @contextlib.contextmanager
    def server():
        read, write = os.pipe()
        proc = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", f"{WINDOW[0]}x{WINDOW[1]}x24",
                                 "-nolisten", "tcp"], pass_fds=(write,), stderr=subprocess.DEVNULL)
        os.close(write)
        with os.fdopen(read) as pipe:
            display = pipe.readline().strip()  # Xvfb names the display here once it listens
        try:
            if not display:
                raise RuntimeError("Xvfb did not start")
            yield f":{display}"
        finally:
            proc.terminate()
            proc.wait(10)
    return server()


# ---- in Blender: the window's side ----

def percentiles(seconds: list[float]) -> dict:
    import numpy as np
    ms = 1000 * np.asarray(seconds)
    return {"count": len(ms), "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "max_ms": float(ms.max())}


def timed_draws(overlay) -> tuple[list, list, list]:
    """As they happen: (seconds, size of the new frame it showed or None) of each draw handler call;
    (seconds, frame size) of each timer tick's upload of strips of a layer's new frame; and (size, seconds from
    its first strip's upload to the redraw that showed it) of each new frame."""
    draws, ticks, shown, first_strip = [], [], [], {}
    upload, draw_layers = overlay.SplatLayer.upload, overlay.draw_layers

    def timed_upload(layer, deadline):
        strips, uploading = layer.strips, layer.stream.frame
        start = time.perf_counter()
        upload(layer, deadline)
        if layer.strips != strips:
            ticks.append((time.perf_counter() - start, (uploading.fields["width"], uploading.fields["height"])))
            first_strip.setdefault(uploading.seq, start)

    def timed_draw_layers(context):  # overlay.draw times this call; the same span, with the new frame it showed
        layers = list(overlay._layers.values())
        before = [layer.drawn_seq for layer in layers]
        start = time.perf_counter()
        draw_layers(context)
        seconds, now = time.perf_counter() - start, time.perf_counter()
        new = [layer.shown for layer, seq in zip(layers, before) if layer.drawn_seq != seq and layer.shown]
        size = (new[0].fields["width"], new[0].fields["height"]) if new else None
        draws.append((seconds, size))
        for frame in new:
            if frame.seq in first_strip:
                shown.append((size, now - first_strip.pop(frame.seq)))
    overlay.SplatLayer.upload, overlay.draw_layers = timed_upload, timed_draw_layers
    return draws, ticks, shown


def scenario(args: dict, result: dict):
    import bpy
    from mathutils import Euler, Vector
    bpy.ops.preferences.addon_install(filepath=args["zip"], overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    addon = sys.modules["splatwright"]
    backend, overlay = addon.scene.live.backend, addon.render.overlay
    prefs = bpy.context.preferences.addons["splatwright"].ui.preferences
    prefs.python, prefs.workdir = args["python"], args["workdir"]
    for obj in list(bpy.data.objects):
        bpy.data.objects.remove(obj)
    bpy.context.scene.splatwright.session = SESSION
    bpy.ops.splatwright.backend_start()  # reopens the session and its checkpoint
    yield from until(lambda: backend.connection == "connected" and backend.status.get("gaussians")
                     and not backend.in_flight, "backend start", 180)
    bpy.ops.splatwright.add_model()
    yield from until(lambda: SESSION in bpy.data.objects and not backend.in_flight, "Add Model to Scene", 120)
    bpy.ops.mesh.primitive_cube_add(size=0.5, location=(0.4, -1.5, 0.0))  # a mesh the splats are composited with

    window = bpy.context.window_manager.windows[0]
    area = next(a for a in window.screen.areas if a.type == "VIEW_3D")
    with bpy.context.temp_override(window=window, area=area):
        bpy.ops.screen.screen_full_area(use_hide_panels=True)  # the viewport fills the window
    yield 0.5
    area = next(a for a in window.screen.areas if a.type == "VIEW_3D")
    region = next(r for r in area.regions if r.type == "WINDOW")
    space = area.spaces.active
    for name in ("toolbar", "ui", "header", "tool_header"):
        setattr(space, f"show_region_{name}", False)
    space.shading.type = "SOLID"
    rv3d = space.region_3d
    rv3d.view_perspective = "PERSP"
    rv3d.view_location, rv3d.view_distance = Vector((0.0, 0.0, 0.0)), 4.0
    draws, ticks, shown = timed_draws(overlay)

    def full_size_shown() -> bool:
        layers = list(overlay._layers.values())
        frame = layers[0].stream.frame if layers else None
        return (frame is not None and not layers[0].waiting() and layers[0].texture_seq == frame.seq
                and (frame.fields["width"], frame.fields["height"]) == (region.width, region.height))
    full = (region.width, region.height)
    for i in range(int(args["uploads"]) + 1):  # the first is a warm-up
        if i == 1:
            draws.clear(), ticks.clear(), shown.clear()
        rv3d.view_rotation = Euler((1.3, 0.0, 0.1 * i)).to_quaternion()
        area.tag_redraw()
        yield 0.1
        yield from until(full_size_shown, "a full-size frame", FRAME_TIMEOUT)
    showing_draws = [seconds for seconds, size in draws if size == full]
    upload_ticks = [seconds for seconds, size in ticks if size == full]
    showing = [seconds for size, seconds in shown if size == full]
    draws.clear()
    for _ in range(int(args["redraws"])):
        area.tag_redraw()
        yield 0.02
    steady = [seconds for seconds, size in draws if size is None]
    result.update(region=[region.width, region.height], blender=bpy.app.version_string,
                  gpu=f"{bpy.app.build_platform.decode()} {gpu_name()}",
                  draw_steady=percentiles(steady), draw_new_frame=percentiles(showing_draws),
                  upload_tick=percentiles(upload_ticks), frame_shown=percentiles(showing),
                  upload_ticks_per_frame=len(upload_ticks) / max(1, len(showing)))
    bpy.ops.splatwright.backend_stop()
    yield from until(lambda: backend.connection == "disconnected" and not backend.in_flight, "backend stop", 60)


def gpu_name() -> str:
    import gpu
    return f"{gpu.platform.vendor_get()} {gpu.platform.renderer_get()}"


if __name__ == "__main__":  # as Blender runs it
    run_in_window(scenario)

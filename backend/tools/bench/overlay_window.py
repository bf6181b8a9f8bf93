"""The window's side of the viewport composite benchmark (overlay.py): the script Blender runs,
`blender --python backend/tools/bench/overlay_window.py -- --zip Z --workdir W --session S --python P --redraws N
--uploads N --out DIR`. It installs the add-on, shows session S's model with a mesh in a full-window viewport,
times the add-on's draw handler and upload ticks, and writes DIR/result.json."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import bpy
import gpu
import numpy as np
from mathutils import Euler, Vector

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: Blender runs this file as a script
from backend.tools.bench.windowed import run_in_window, until  # noqa: E402

FRAME_TIMEOUT = 300.0  # seconds for a full-size frame from the CPU backend on a loaded machine


def percentiles(seconds: list[float]) -> dict:
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
    bpy.ops.preferences.addon_install(filepath=args["zip"], overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    addon = sys.modules["splatwright"]
    backend, overlay = addon.scene.live.backend, addon.render.overlay
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = args["python"], args["workdir"]
    for obj in list(bpy.data.objects):
        bpy.data.objects.remove(obj)
    bpy.context.scene.splatwright.session = args["session"]
    bpy.ops.splatwright.backend_start()  # reopens the session and its checkpoint
    yield from until(lambda: backend.connection == "connected" and backend.status.get("gaussians")
                     and not backend.in_flight, "backend start", 180)
    bpy.ops.splatwright.add_model()
    yield from until(lambda: args["session"] in bpy.data.objects and not backend.in_flight, "Add Model to Scene", 120)
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
    return f"{gpu.platform.vendor_get()} {gpu.platform.renderer_get()}"


if __name__ == "__main__":  # as Blender runs it
    run_in_window(scenario)

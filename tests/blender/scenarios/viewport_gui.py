"""The live viewport in a real Blender window (Debian's Blender 3.4 under Xvfb, run by test_viewport_gui.py):
install the built zip as a legacy add-on, start a CPU backend through it, load a PLY, switch the 3D viewport to
Rendered with the Splatwright engine, wait for a full-size frame and take a screenshot, under the Standard
view transform and then under Filmic, keeping the frame the view showed. Writes result.json into the output
folder for pytest, then quits.

    PYTHONPATH=tests:. blender --factory-startup --enable-event-simulate -p 0 0 1280 800 \
        --python tests/blender/scenarios/viewport_gui.py -- --zip Z --ply P --python PY --out DIR

Blender's event loop runs the whole time; the scenario is a generator stepped by a timer, so it never blocks it.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import bpy
import numpy as np
from mathutils import Euler, Vector

from backend.tools.bench.windowed import data_writable, run_in_window, until
from blender.blocking_calls import BlockingCalls

FRAME_TIMEOUT = 120.0
TICKS_DURING_RENDER = 5  # a render that blocked Blender's main thread would let none through
UPLOAD_SIZE = (1920, 1080)


def view3d():
    window = bpy.context.window_manager.windows[0]
    area = next(a for a in window.screen.areas if a.type == "VIEW_3D")
    region = next(r for r in area.regions if r.type == "WINDOW")
    return window, area, region, area.spaces.active


def shown_frame(view, out: Path, name: str) -> str:
    """The frame `view` shows, top-down RGBA8 as the backend sent it, saved for pytest."""
    frame = view.stream.frame
    pixels = np.round(frame.pixels * 255.0).astype(np.uint8)
    path = out / f"{name}_frame.npy"
    np.save(path, pixels.reshape(frame.fields["height"], frame.fields["width"], 4)[::-1])
    return str(path)


def screenshot(path: Path) -> str:
    window, area, region, _ = view3d()
    with bpy.context.temp_override(window=window, area=area, region=region):
        bpy.ops.screen.screenshot(filepath=str(path), check_existing=False)
    return str(path)


def cancelled_capture(addon, out: Path, result: dict):
    """The Capture button's modal run, cancelled with Esc after a few views: what was rendered is kept (written
    and sent), and the scene is as it was."""
    scene = bpy.context.scene
    s = scene.splatwright
    scene.render.engine = "BLENDER_WORKBENCH"  # the captures' renderer; quick under Mesa
    s.source, s.orbit_count, s.resolution_percentage, s.max_side, s.test_every = "ORBIT", 12, 5, 0, 4
    s.folder, s.point_count, s.render_engine, s.samples = str(out / "dataset"), 500, "SCENE", 0
    camera, frame = scene.camera, scene.frame_current
    window, area, region, _ = view3d()
    with bpy.context.temp_override(window=window, area=area, region=region):
        result["capture_invoked"] = list(bpy.ops.splatwright.capture("INVOKE_DEFAULT"))
    # Before its first view the backend's session is still the one before: nothing may open another or train it.
    result["blocked_during_capture"] = {
        "import": addon.ops.formats.SPLATWRIGHT_OT_import_splats.blocked(bpy.context),
        "train": addon.ops.training.SPLATWRIGHT_OT_train_start.blocked(bpy.context),
        "views_stored": addon.scene.live.capture.done}
    yield from until(lambda: addon.scene.live.capture is None or addon.scene.live.capture.done >= 5, "five captured views", 60)
    window.event_simulate(type="ESC", value="PRESS")
    yield from until(lambda: addon.scene.live.capture is None, "the capture ends on Esc", 30)
    yield from until(lambda: not addon.scene.live.backend.in_flight, "captured views sent", 30)
    folder = Path(s.capture_folder)
    frames = {split: len(json.loads((folder / f"transforms_{split}.json").read_text())["frames"])
              for split in ("train", "test") if (folder / f"transforms_{split}.json").is_file()}
    result["cancelled_capture"] = {
        "frames": frames, "pngs": len(list(folder.glob("*/*.png"))), "points": (folder / "points3d.ply").is_file(),
        "views_sent": addon.scene.live.backend.status.get("views"), "camera_restored": scene.camera == camera,
        "frame_restored": scene.frame_current == frame,
        "orbit_camera_left": any(o.name.startswith("Splatwright Orbit") for o in bpy.data.objects)}


class CapturePanelForScreenshot(bpy.types.Panel):
    """The add-on's main panel drawn in the sidebar's first tab, so a screenshot shows it mid-capture."""
    bl_space_type, bl_region_type, bl_category, bl_label = "VIEW_3D", "UI", "Item", "Splatwright Capture"
    bl_idname = "VIEW3D_PT_splatwright_capture_shot"

    def draw(self, context):
        sys.modules["splatwright"].ui.panels.SPLATWRIGHT_PT_main.draw(self, context)


def capture_during_render(addon, out: Path, result: dict):
    """Views render as Blender render jobs: while one renders, timers and redraws go on; Cancel Capture ends
    the capture midway through a render, keeping the views rendered before it. Frame 1 renders with a few
    samples, frames 2 and 3 with so many that only a cancel ends their renders."""
    scene = bpy.context.scene
    s = scene.splatwright
    scene.render.engine = "CYCLES"
    scene.render.resolution_x, scene.render.resolution_y = 96, 64
    scene.render.threads_mode, scene.render.threads = "FIXED", 1  # leave a core to Blender's window
    # Denoising on, as Blender starts, in a Cycles built without a denoiser: the capture turns it off.
    scene.cycles.use_denoising, scene.cycles.use_adaptive_sampling = True, False
    scene.frame_start, scene.frame_end, scene.frame_current = 1, 3, 1
    for frame, samples in ((1, 4), (2, 1_000_000)):
        scene.cycles.samples = samples
        scene.cycles.keyframe_insert("samples", frame=frame)
    s.source, s.frame_step, s.resolution_percentage, s.max_side, s.test_every = "ANIMATION", 1, 100, 0, 0
    s.render_engine, s.samples, s.initial_points = "SCENE", 0, False
    s.folder = str(out / "dataset-jobs")
    window, area, region, space = view3d()
    space.show_region_ui = True
    bpy.utils.register_class(CapturePanelForScreenshot)
    ticks, draws = [], []
    handler = bpy.types.SpaceView3D.draw_handler_add(lambda: draws.append(time.monotonic()), (), "WINDOW",
                                                     "POST_PIXEL")

    def tick():
        ticks.append(time.monotonic())
        area.tag_redraw()
        return 0.02
    bpy.app.timers.register(tick)
    with bpy.context.temp_override(window=window, area=area, region=region):
        result["job_capture_invoked"] = list(bpy.ops.splatwright.capture("INVOKE_DEFAULT"))
    job = addon.scene.live.capture
    yield from until(lambda: job.done == 1 and bpy.app.is_job_running("RENDER"), "frame 2 rendering", 120)
    start, ticks_before, draws_before = time.monotonic(), len(ticks), len(draws)
    yield from until(lambda: len(ticks) - ticks_before >= TICKS_DURING_RENDER and len(draws) - draws_before >= 2,
                     "timer ticks and redraws while frame 2 renders", 90)
    shot = screenshot(out / "capture_panel.png")
    rendering = bpy.app.is_job_running("RENDER")
    cancel_at = time.monotonic()
    bpy.ops.splatwright.capture_cancel()
    yield from until(lambda: addon.scene.live.capture is None, "the capture ends on Cancel Capture", 60)
    ended = time.monotonic()
    bpy.app.timers.unregister(tick)
    bpy.types.SpaceView3D.draw_handler_remove(handler, "WINDOW")
    bpy.utils.unregister_class(CapturePanelForScreenshot)
    space.show_region_ui = False
    folder = Path(s.capture_folder)
    result["job_capture"] = {
        "render_seconds": cancel_at - start, "ticks": len(ticks) - ticks_before,
        "draws": len(draws) - draws_before, "rendering_when_cancelled": rendering,
        "cancel_seconds": ended - cancel_at, "job_running_after": bpy.app.is_job_running("RENDER"),
        "frames": len(json.loads((folder / "transforms_train.json").read_text())["frames"]),
        "pngs": sorted(p.name for p in folder.glob("*/*.png")), "panel_screenshot": shot,
        "engine_restored": scene.render.engine == "CYCLES", "denoising_restored": scene.cycles.use_denoising,
        "without_denoising": job.without_denoising, "summary": job.summary(),
        "render_window_after": addon.scene.capture.render_window(bpy.context) is not None}
    scene.animation_data_clear()


def watch_view_draw(engine) -> dict:
    """Note the calls that may block made inside the engine's view_draw, and the messages it draws."""
    waits, seen = BlockingCalls(), {"draws": 0, "messages": []}
    view_draw, draw_message = engine.SPLATWRIGHT_RE_engine.view_draw, engine.draw_message

    def watched_view_draw(self, context, depsgraph):
        seen["draws"] += 1
        with waits.watch("view_draw"):
            return view_draw(self, context, depsgraph)

    def noted_draw_message(region, text):
        if text not in seen["messages"]:
            seen["messages"].append(text)
        return draw_message(region, text)
    engine.SPLATWRIGHT_RE_engine.view_draw, engine.draw_message = watched_view_draw, noted_draw_message
    seen["blocking"] = waits.noted
    return seen


def info_log(window) -> list[str]:
    """The reports in Blender's Info log, copied from an Info editor that briefly replaces the last area."""
    area = window.screen.areas[-1]
    kept = area.type
    area.type = "INFO"
    try:
        region = next(r for r in area.regions if r.type == "WINDOW")
        with bpy.context.temp_override(window=window, area=area, region=region):
            bpy.ops.info.select_all(action="SELECT")
            bpy.ops.info.report_copy()
    finally:
        area.type = kept
    return bpy.context.window_manager.clipboard.splitlines()


def under_filmic(addon, out: Path, result: dict):
    """The view transform turns Filmic: the view draws its frame as before until the add-on's inverse of
    Filmic is ready, then through it. A screenshot then, with the frame and the inverse."""
    scene = bpy.context.scene
    scene.view_settings.view_transform = "Filmic"
    key = addon.render.view_colors.view_key(scene)
    view = next(iter(addon.render.engine._views))
    view3d()[1].tag_redraw()
    start = time.monotonic()
    yield from until(lambda: view.shown_key == key, "the view drawn through Filmic's inverse", 60)
    seconds = time.monotonic() - start
    yield 0.5  # a settled viewport
    inverse = addon.render.view_colors.ready_inverse(key)
    np.savez(out / "filmic_inverse.npz", **vars(inverse))
    result["filmic"] = {"seconds": seconds, "screenshot": screenshot(out / "viewport_filmic.png"),
                        "frame": shown_frame(view, out, "filmic"), "inverse": str(out / "filmic_inverse.npz"),
                        "frame_seq_unchanged": view.texture_seq == view.stream.frame.seq}
    scene.view_settings.view_transform = "Standard"


def render_job(addon, out: Path, result: dict):
    """F12 as Blender's render job under Filmic with an exposure, a view transform the add-on has no inverse
    of yet: the render's thread waits while the timer samples the transform. The result as Blender saves it,
    with the backend's frame and the inverse."""
    scene = bpy.context.scene
    scene.view_settings.view_transform, scene.view_settings.exposure = "Filmic", 0.5
    scene.render.resolution_x, scene.render.resolution_y, scene.render.resolution_percentage = 80, 60, 100
    output = scene.render.image_settings
    output.file_format, output.color_mode, output.color_depth = "PNG", "RGB", "8"
    engine = addon.render.engine.SPLATWRIGHT_RE_engine
    frames, threads, fetch = [], [], engine.fetch

    def kept_fetch(self, scene):
        threads.append(threading.current_thread() is threading.main_thread())
        reply, depth_scale = fetch(self, scene)
        frames.append(addon.core.client.decode_frame(reply)[::-1])  # top-down
        return reply, depth_scale
    engine.fetch = kept_fetch
    view = bpy.context.preferences.view
    display, view.render_display_type = view.render_display_type, "NONE"
    window, area, region, _ = view3d()
    try:
        with bpy.context.temp_override(window=window, area=area, region=region):
            result["render_job_invoked"] = list(bpy.ops.render.render("INVOKE_DEFAULT"))
        yield from until(lambda: not bpy.app.is_job_running("RENDER") and data_writable(scene), "the render job", 90)
    finally:
        view.render_display_type, engine.fetch = display, fetch
    path = out / "render_job.png"
    bpy.data.images["Render Result"].save_render(str(path), scene=scene)
    inverse = addon.render.view_colors.ready_inverse(addon.render.view_colors.view_key(scene))
    np.savez(out / "render_job_inverse.npz", **vars(inverse))
    np.save(out / "render_job_frame.npy", frames[-1])
    result["render_job"] = {"png": str(path), "frame": str(out / "render_job_frame.npy"),
                            "inverse": str(out / "render_job_inverse.npz"), "frames": len(frames),
                            "on_main_thread": threads}
    scene.view_settings.view_transform, scene.view_settings.exposure = "Standard", 0.0


def scenario(args: dict, result: dict):
    out = Path(args["out"])
    bpy.ops.preferences.addon_install(filepath=args["zip"], overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    addon = sys.modules["splatwright"]
    backend = addon.scene.live.backend
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = args["python"], str(out / "sessions")  # the checkout's environment
    bpy.ops.splatwright.backend_start()
    yield from until(lambda: backend.connection == "connected", "backend start", 120)
    yield from cancelled_capture(addon, out, result)
    yield from capture_during_render(addon, out, result)
    bpy.ops.splatwright.import_splats(filepath=args["ply"])
    yield from until(lambda: backend.status.get("gaussians") and not backend.in_flight, "load PLY", 60)

    scene = bpy.context.scene
    scene.render.engine = "SPLATWRIGHT"
    scene.view_settings.view_transform = "Standard"  # display values as the frames hold them
    window, area, region, space = view3d()
    space.overlay.show_overlays = False  # nothing but the engine's frame in the region
    space.show_gizmo = False
    for name in ("toolbar", "ui", "header", "tool_header"):
        setattr(space, f"show_region_{name}", False)
    rv3d = space.region_3d
    rv3d.view_perspective = "PERSP"
    rv3d.view_location = Vector((0.0, 0.0, 0.0))
    rv3d.view_rotation = Euler((1.1, 0.0, 0.7)).to_quaternion()
    rv3d.view_distance = 6.0
    engine = addon.render.engine
    view_draws = watch_view_draw(engine)
    space.shading.type = "RENDERED"
    area.tag_redraw()

    def full_frame_shown() -> bool:
        for view in list(engine._views):
            frame = view.stream.frame
            if frame is not None and view.texture_seq == frame.seq and frame.fields["width"] == region.width \
                    and frame.fields["height"] == region.height:
                return True
        return False
    start = time.monotonic()
    yield from until(full_frame_shown, "a full-size frame in the viewport", FRAME_TIMEOUT)
    result["first_full_frame_seconds"] = time.monotonic() - start
    area.tag_redraw()
    yield 0.5  # one more redraw with nothing new: the screenshot shows a settled viewport
    # With every frame shown and nothing asked, the 100 Hz frame watch stops waking Blender.
    yield from until(lambda: not bpy.app.timers.is_registered(engine._watch), "the frame watch ends when settled", 5)

    # The camera view_draw saw, from the same matrices, for pytest to render through the backend.
    cam = addon.core.cameras.from_blender_view(np.array(rv3d.view_matrix), np.array(rv3d.window_matrix),
                                               region.width, region.height)
    view = next(iter(engine._views))
    result.update({"screenshot": screenshot(out / "viewport.png"), "frame": shown_frame(view, out, "standard"),
                   "region": [region.x, region.y, region.width, region.height],
                   "window": [window.width, window.height],
                   "camera": addon.core.codecs.camera_to_wire(cam),
                   "draw_seconds": list(engine.draw_seconds), "upload_seconds": list(engine.upload_seconds),
                   "view_draws": view_draws})

    # The upload the main thread does per frame, at 1920x1080, from the buffer the stream thread prepares.
    pixels = addon.logic.colors.display_pixels(np.zeros((UPLOAD_SIZE[1], UPLOAD_SIZE[0], 4), np.uint8))
    timings = []
    for _ in range(5):
        t0 = time.perf_counter()
        engine.frame_texture(pixels, *UPLOAD_SIZE)
        timings.append(time.perf_counter() - t0)
    result["upload_1080p_seconds"] = timings
    yield from under_filmic(addon, out, result)
    yield from render_job(addon, out, result)

    space.shading.type = "SOLID"
    bpy.ops.splatwright.backend_stop()
    yield from until(lambda: backend.connection == "disconnected" and not backend.in_flight, "backend stop", 60)
    result["errors"] = backend.last_error
    result["info_log"] = info_log(window)


run_in_window(scenario)

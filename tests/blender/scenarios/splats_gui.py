"""Splats drawn with the scene in a real Blender window (Debian's Blender 3.4 under Xvfb, run by
test_splats_gui.py): install the built zip as a legacy add-on, start a CPU backend that reopens a trained session,
Add Model to Scene, and look at it in Solid shading past a cube in front of it and a wall through its middle.
Screenshots with the splat object shown, hidden, and moved, then cropped by a crop box with a second session's
model in front of it; the frames drawn and the cameras are saved for pytest. Then F12 with Cycles as render jobs, and the .blend for `blender -b scene.blend -f 1`. Writes
result.json into the output folder, then quits. The scene is splat_scene.py's, which splats.py renders too.

    PYTHONPATH=tests:. blender --factory-startup -p 0 0 W H --python tests/blender/scenarios/splats_gui.py -- \
        --zip Z --workdir W --session S --second S2 --moving S3 --python PY --out DIR

Blender's event loop runs the whole time; the scenario is a generator stepped by a timer, so it never blocks it.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import bpy
import numpy as np
from mathutils import Euler, Vector

from backend.tools.bench.windowed import data_writable, run_in_window, until
from blender.blocking_calls import BlockingCalls
from blender.splat_scene import (CROP_LOCATION, CROP_SCALE, CUBE_COLOR, MOVE, SECOND_AT, WALL_COLOR, add_wall_and_cube,
                                 render_with_cycles)

FRAME_TIMEOUT = 120.0
BACKGROUND_COLOR = (0.05, 0.05, 0.05)
TIMELINE_END = 24  # the scene's last frame while a 4D model is shown: time 1


def view3d():
    window = bpy.context.window_manager.windows[0]
    area = next(a for a in window.screen.areas if a.type == "VIEW_3D")
    region = next(r for r in area.regions if r.type == "WINDOW")
    return window, area, region, area.spaces.active


def show_solid(space) -> None:
    """Solid shading in flat object colours: each mesh shows its colour as it is."""
    shading = space.shading
    shading.type, shading.light, shading.color_type = "SOLID", "FLAT", "OBJECT"
    shading.show_object_outline = shading.show_cavity = shading.show_shadows = False
    shading.background_type, shading.background_color = "VIEWPORT", BACKGROUND_COLOR
    space.overlay.show_overlays = False  # the splats are drawn all the same; no grid or Empty's outline
    space.show_gizmo = False
    for name in ("toolbar", "ui", "header", "tool_header"):
        setattr(space, f"show_region_{name}", False)
    rv3d = space.region_3d
    rv3d.view_perspective = "PERSP"
    rv3d.view_location = Vector((0.0, 0.0, 0.2))
    rv3d.view_rotation = Euler((1.47, 0.0, 0.0)).to_quaternion()  # from the front, a little above
    rv3d.view_distance = 6.0


def watch_draws(overlay) -> dict:
    """Note the calls that may block made inside the overlay's drawing."""
    waits, seen = BlockingCalls(), {"draws": 0}
    draw_layers = overlay.draw_layers

    def watched(context):
        seen["draws"] += 1
        with waits.watch("draw_layers"):
            return draw_layers(context)
    overlay.draw_layers = watched
    seen["blocking"] = waits.noted
    return seen


def settled(layer, region) -> bool:
    """Whether `layer` shows a full-size frame of the region and waits for no other."""
    frame = layer.stream.frame
    return frame is not None and not layer.waiting() and layer.texture_seq == frame.seq and \
        (frame.fields["width"], frame.fields["height"]) == (region.width, region.height)


def settled_layer(overlay, region, other_than=None):
    """The splats' layer of the viewport's region (not `other_than`) once it settled, or None."""
    for (key, _), layer in overlay._layers.items():
        if key == region.as_pointer() and layer is not other_than and settled(layer, region):
            return layer
    return None


def saved_frame(addon, name: str, out: Path, layer, model_name: str) -> dict:
    """`layer`'s frame, the viewport's camera and the placement of the model object `model_name`, saved as
    `name`."""
    window, area, region, space = view3d()
    frame = layer.shown
    size = (frame.fields["height"], frame.fields["width"])
    rgba, depth = addon.core.codecs.unpacked_layer(frame.pixels)
    np.save(out / f"{name}_rgba.npy", rgba.reshape(*size, 4))
    np.save(out / f"{name}_depth.npy", depth.reshape(size))
    view = addon.scene.reading.region_camera(region, space.region_3d)
    return {"rgba": str(out / f"{name}_rgba.npy"), "depth": str(out / f"{name}_depth.npy"),
            "camera": addon.core.codecs.camera_to_wire(view), "background": frame.fields["background"],
            "model_matrix": addon.scene.splats.model_matrix(bpy.data.objects[model_name]).tolist(),
            "strips": layer.strips, "rows_per_strip": addon.render.overlay.STRIP_PIXELS // frame.fields["width"]}


def snapshot(addon, name: str, out: Path, result: dict, layer=None):
    """A screenshot once the viewport settled; with `layer`, its frame and the cameras drawn."""
    window, area, region, space = view3d()
    area.tag_redraw()
    yield 0.5  # one more redraw with nothing new
    shot = out / f"{name}.png"
    with bpy.context.temp_override(window=window, area=area, region=region):
        bpy.ops.screen.screenshot(filepath=str(shot), check_existing=False)
    taken = {"screenshot": str(shot)}
    if layer is not None:
        taken.update(saved_frame(addon, name, out, layer, result["session"]))
    result[name] = taken


def several_models(addon, args: dict, out: Path, result: dict):
    """The first model cropped by a crop box, and a second session's model in front of it: both drawn."""
    window, area, region, space = view3d()
    model, overlay = bpy.data.objects[args["session"]], addon.render.overlay
    other = addon.scene.splats.add_model_object(bpy.context.view_layer, bpy.context.scene.collection,
                                                args["second"], (0.0, 0.0, 0.0), 0.5)
    other.matrix_world = SECOND_AT
    bpy.context.view_layer.objects.active = model
    bpy.ops.splatwright.add_crop_box()
    box = bpy.context.view_layer.objects.active
    box.location, box.scale = CROP_LOCATION, CROP_SCALE
    bpy.context.view_layer.update()
    area.tag_redraw()
    keys = [(region.as_pointer(), name) for name in (args["session"], args["second"])]
    yield from until(lambda: all(k in overlay._layers and settled(overlay._layers[k], region) for k in keys),
                     "frames of the cropped model and the second one", FRAME_TIMEOUT)
    yield from snapshot(addon, "several", out, result)
    result["several"].update(crop=addon.scene.splats.model_choice(model, bpy.context.scene)["crop"].tolist(), frames={
        label: saved_frame(addon, f"several_{label}", out, overlay._layers[key], key[1])
        for key, label in zip(keys, ("first", "second"))})
    bpy.data.objects.remove(box)
    bpy.data.objects.remove(other)


def timeline(addon, args: dict, out: Path, result: dict):
    """A 4D session's model (the first one hidden) at the scene's first and last frames."""
    window, area, region, space = view3d()
    scene, overlay = bpy.context.scene, addon.render.overlay
    first = bpy.data.objects[args["session"]]
    first.hide_set(True)
    moving = addon.scene.splats.add_model_object(bpy.context.view_layer, scene.collection, args["moving"],
                                                 (0.0, 0.0, 0.0), 0.5)
    scene.frame_start, scene.frame_end = 1, TIMELINE_END
    key = (region.as_pointer(), moving.name)
    for frame in (1, TIMELINE_END):
        scene.frame_set(frame)
        area.tag_redraw()
        time = addon.scene.splats.scene_time(scene)

        def shows_the_frame():
            layer = overlay._layers.get(key)
            return (layer is not None and layer.shows[2] == time and settled(layer, region)
                    and layer.of_this_time(layer.shown))
        yield from until(shows_the_frame, f"the 4D model's frame at frame {frame}", FRAME_TIMEOUT)
        yield from snapshot(addon, f"frame_{frame}", out, result)
        result[f"frame_{frame}"].update(saved_frame(addon, f"frame_{frame}", out, overlay._layers[key], moving.name),
                                        time=time)
    bpy.data.objects.remove(moving)
    first.hide_set(False)


def final_renders(addon, out: Path, result: dict):
    """F12 with Cycles through a scene camera as a render job (its thread fetches the splats), with the splat
    object rendered and left out; then the .blend and the preferences for `blender -b scene.blend -f 1`."""
    scene, model = bpy.context.scene, bpy.data.objects[result["session"]]
    render_with_cycles(scene)
    scene.render.image_settings.file_format, scene.render.image_settings.color_mode = "PNG", "RGB"
    bpy.context.preferences.view.render_display_type = "NONE"  # no render window
    window, area, region, _ = view3d()
    finished = []

    def completed(*args):  # called on the render's thread
        finished.append(True)
    bpy.app.handlers.render_complete.append(completed)
    for name, left_out in (("f12", False), ("f12_hidden", True)):
        model.hide_render = left_out
        finished.clear()
        with bpy.context.temp_override(window=window, area=area, region=region):
            bpy.ops.render.render("INVOKE_DEFAULT")
        yield from until(lambda: finished and not bpy.app.is_job_running("RENDER") and data_writable(model),
                         f"the render {name}", 120)
        bpy.data.images["Render Result"].save_render(str(out / f"{name}.png"))
        result[name] = str(out / f"{name}.png")
    bpy.app.handlers.render_complete.remove(completed)
    model.hide_render = False
    result["render_camera"] = addon.core.codecs.camera_to_wire(addon.scene.reading.camera_of(scene.camera, scene))
    result["render_model_matrix"] = addon.scene.splats.model_matrix(model).tolist()
    scene.render.filepath = str(out / "cli_")
    bpy.ops.wm.save_userpref()  # the add-on enabled, with its Python and sessions folder
    bpy.ops.wm.save_as_mainfile(filepath=str(out / "scene.blend"))
    result["blend"] = str(out / "scene.blend")


def scenario(args: dict, result: dict):
    out = Path(args["out"])
    result["session"] = args["session"]
    bpy.ops.preferences.addon_install(filepath=args["zip"], overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    addon = sys.modules["splatwright"]
    backend = addon.scene.live.backend
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = args["python"], args["workdir"]
    for obj in list(bpy.data.objects):
        bpy.data.objects.remove(obj)
    add_wall_and_cube(bpy.context.scene)
    bpy.context.scene.splatwright.session = args["session"]
    bpy.ops.splatwright.backend_start()  # reopens the session and its checkpoint
    yield from until(lambda: backend.connection == "connected" and backend.status.get("gaussians")
                     and not backend.in_flight, "backend start", 120)
    bpy.ops.splatwright.add_model()
    yield from until(lambda: args["session"] in bpy.data.objects, "Add Model to Scene", 60)
    model = bpy.data.objects[args["session"]]

    window, area, region, space = view3d()
    overlay = addon.render.overlay
    draws = watch_draws(overlay)
    show_solid(space)
    area.tag_redraw()
    start = time.monotonic()
    yield from until(lambda: settled_layer(overlay, region), "a full-size frame of the splats", FRAME_TIMEOUT)
    result["first_full_frame_seconds"] = time.monotonic() - start
    layer = settled_layer(overlay, region)
    yield from snapshot(addon, "shown", out, result, layer)

    model.hide_set(True)
    yield from until(lambda: not overlay._layers, "the hidden model's frames closed", 10)
    yield from snapshot(addon, "hidden", out, result)
    model.hide_set(False)  # shown again, moved: a new layer of frames

    model.matrix_world = MOVE @ model.matrix_world
    area.tag_redraw()
    yield from until(lambda: settled_layer(overlay, region, layer), "a frame of the moved model", FRAME_TIMEOUT)
    yield from snapshot(addon, "moved", out, result, settled_layer(overlay, region, layer))
    result.update(region=[region.x, region.y, region.width, region.height], window=[window.width, window.height],
                  draws=draws, draw_seconds=list(overlay.draw_seconds), wall_color=WALL_COLOR,
                  cube_color=CUBE_COLOR)

    yield from several_models(addon, args, out, result)
    yield from timeline(addon, args, out, result)
    space.shading.type = "WIREFRAME"  # not a shading the splats are drawn in: their frames stop
    yield from until(lambda: not overlay._layers, "no frames in wireframe shading", 10)
    yield from final_renders(addon, out, result)
    bpy.ops.splatwright.backend_stop()
    yield from until(lambda: backend.connection == "disconnected" and not backend.in_flight, "backend stop", 60)
    result["errors"] = backend.last_error


run_in_window(scenario)

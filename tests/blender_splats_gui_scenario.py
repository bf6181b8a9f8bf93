"""Splats drawn with the scene in a real Blender window (Debian's Blender 3.4 under Xvfb, run by
test_splats_gui.py): install the built zip as a legacy add-on, start a CPU backend that reopens a trained session,
Add Model to Scene, and look at it in Solid shading past a cube in front of it and a wall through its middle.
Screenshots with the splat object shown, hidden, and moved, then cropped by a crop box with a second session's
model in front of it; the frames drawn and the cameras are saved for pytest. Then F12 with Cycles as render jobs, and the .blend for `blender -b scene.blend -f 1`. Writes
result.json into the output folder, then quits. The scene (add_wall_and_cube) is blender_splats_scenario.py's
too.

    blender --factory-startup -p 0 0 W H --python tests/blender_splats_gui_scenario.py -- --zip Z --workdir W \
        --session S --second S2 --moving S3 --python PY --out DIR

Blender's event loop runs the whole time; the scenario is a generator stepped by a timer, so it never blocks it.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import bpy
import numpy as np
from mathutils import Euler, Matrix, Vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from blocking_calls import BlockingCalls  # noqa: E402
from backend.tools.bench.windowed import data_writable, run_in_window, until  # noqa: E402

FRAME_TIMEOUT = 120.0
WALL_COLOR, CUBE_COLOR, BACKGROUND_COLOR = (0.1, 0.45, 0.2), (0.05, 0.1, 0.6), (0.05, 0.05, 0.05)
CUBE_AT, CUBE_SIZE = (0.45, -2.0, 0.0), 0.5  # in front of the model, which sits around the origin
CAMERA_AT, LOOK_AT, RENDER_SIZE = (0.0, -6.0, 0.6), (0.0, 0.0, 0.2), (64, 48)
MOVE = Matrix.Translation((-0.3, 0.0, -0.2)) @ Euler((0.0, 0.0, 0.35)).to_matrix().to_4x4()
SECOND_AT = Matrix.Translation((0.35, -3.4, 0.25)) @ Matrix.Scale(0.5, 4)  # a second model, in front of the first
TIMELINE_END = 24  # the scene's last frame while a 4D model is shown: time 1
CROP_LOCATION, CROP_SCALE = (0.45, 0.0, 0.1), (0.6, 1.5, 1.5)  # in the first model object's space: its right part


def view3d():
    window = bpy.context.window_manager.windows[0]
    area = next(a for a in window.screen.areas if a.type == "VIEW_3D")
    region = next(r for r in area.regions if r.type == "WINDOW")
    return window, area, region, area.spaces.active


def emitting(obj, rgb) -> None:
    """`rgb` as the object's Solid colour and as its material's Emission, which renders it as it is."""
    obj.color = (*rgb, 1.0)
    material = bpy.data.materials.new(obj.name)
    material.use_nodes = True
    nodes = material.node_tree.nodes
    nodes.clear()
    emission, output = nodes.new("ShaderNodeEmission"), nodes.new("ShaderNodeOutputMaterial")
    emission.inputs["Color"].default_value = (*rgb, 1.0)
    material.node_tree.links.new(emission.outputs["Emission"], output.inputs["Surface"])
    obj.data.materials.append(material)


def add_wall_and_cube(scene) -> None:
    """A wall (the plane y = 0, facing -y) through the model's middle, a cube in front of it, and a camera
    looking at them; the display values as the renders hold them."""
    scene.view_settings.view_transform = "Standard"
    scene.render.dither_intensity = 0.0  # the display transform's noise would blur the comparisons
    bpy.ops.mesh.primitive_plane_add(size=20.0, rotation=(1.5707963, 0.0, 0.0))
    bpy.context.active_object.name = "Wall"
    emitting(bpy.context.active_object, WALL_COLOR)
    bpy.ops.mesh.primitive_cube_add(size=CUBE_SIZE, location=CUBE_AT)
    bpy.context.active_object.name = "Cube"
    emitting(bpy.context.active_object, CUBE_COLOR)
    bpy.ops.object.select_all(action="DESELECT")
    camera = bpy.data.objects.new("Camera", bpy.data.cameras.new("Camera"))
    camera.location = CAMERA_AT
    camera.rotation_euler = (Vector(LOOK_AT) - Vector(CAMERA_AT)).to_track_quat("-Z", "Y").to_euler()
    scene.collection.objects.link(camera)
    scene.camera = camera


def render_with_cycles(scene) -> None:
    scene.render.engine = "CYCLES"
    scene.cycles.device, scene.cycles.samples, scene.cycles.use_denoising, scene.cycles.seed = "CPU", 1, False, 1
    scene.render.resolution_x, scene.render.resolution_y = RENDER_SIZE
    scene.render.resolution_percentage = 100


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
    view = addon.scene_io.region_camera(region, space.region_3d)
    return {"rgba": str(out / f"{name}_rgba.npy"), "depth": str(out / f"{name}_depth.npy"),
            "camera": addon.core.codecs.camera_to_wire(view), "background": frame.fields["background"],
            "model_matrix": addon.scene_splats.model_matrix(bpy.data.objects[model_name]).tolist(),
            "strips": layer.strips, "rows_per_strip": addon.overlay.STRIP_PIXELS // frame.fields["width"]}


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
    model, overlay = bpy.data.objects[args["session"]], addon.overlay
    other = addon.scene_splats.add_model_object(bpy.context.view_layer, bpy.context.scene.collection,
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
    result["several"].update(crop=addon.scene_splats.model_choice(model, bpy.context.scene)["crop"].tolist(), frames={
        label: saved_frame(addon, f"several_{label}", out, overlay._layers[key], key[1])
        for key, label in zip(keys, ("first", "second"))})
    bpy.data.objects.remove(box)
    bpy.data.objects.remove(other)


def timeline(addon, args: dict, out: Path, result: dict):
    """A 4D session's model (the first one hidden) at the scene's first and last frames."""
    window, area, region, space = view3d()
    scene, overlay = bpy.context.scene, addon.overlay
    first = bpy.data.objects[args["session"]]
    first.hide_set(True)
    moving = addon.scene_splats.add_model_object(bpy.context.view_layer, scene.collection, args["moving"],
                                                 (0.0, 0.0, 0.0), 0.5)
    scene.frame_start, scene.frame_end = 1, TIMELINE_END
    key = (region.as_pointer(), moving.name)
    for frame in (1, TIMELINE_END):
        scene.frame_set(frame)
        area.tag_redraw()
        time = addon.scene_splats.scene_time(scene)

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
    result["render_camera"] = addon.core.codecs.camera_to_wire(addon.scene_io.camera_of(scene.camera, scene))
    result["render_model_matrix"] = addon.scene_splats.model_matrix(model).tolist()
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
    backend = addon.live.backend
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
    overlay = addon.overlay
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


if __name__ == "__main__":  # as Blender runs it; blender_splats_scenario.py imports the scene from here
    run_in_window(scenario)

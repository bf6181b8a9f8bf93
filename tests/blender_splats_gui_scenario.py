"""Splats drawn with the scene in a real Blender window (Debian's Blender 3.4 under Xvfb, run by
test_splats_gui.py): install the built zip as a legacy add-on, start a CPU backend that reopens a trained session,
Add Model to Scene, and look at it in Solid shading past a cube in front of it and a wall through its middle.
Screenshots with the splat object shown, hidden, and moved; the frames drawn and the cameras are saved for
pytest. Then F12 with Cycles as render jobs, and the .blend for `blender -b scene.blend -f 1`. Writes
result.json into the output folder, then quits. The scene (add_wall_and_cube) is blender_splats_scenario.py's
too.

    blender --factory-startup -p 0 0 W H --python tests/blender_splats_gui_scenario.py -- --zip Z --workdir W \
        --session S --python PY --out DIR

Blender's event loop runs the whole time; the scenario is a generator stepped by a timer, so it never blocks it.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import bpy
import numpy as np
from mathutils import Euler, Matrix, Vector

sys.path.insert(0, str(Path(__file__).resolve().parent))
from blocking_calls import BlockingCalls  # noqa: E402

FRAME_TIMEOUT = 120.0
WALL_COLOR, CUBE_COLOR, BACKGROUND_COLOR = (0.1, 0.45, 0.2), (0.05, 0.1, 0.6), (0.05, 0.05, 0.05)
CUBE_AT, CUBE_SIZE = (0.45, -2.0, 0.0), 0.5  # in front of the model, which sits around the origin
CAMERA_AT, LOOK_AT, RENDER_SIZE = (0.0, -6.0, 0.6), (0.0, 0.0, 0.2), (64, 48)
MOVE = Matrix.Translation((-0.3, 0.0, -0.2)) @ Euler((0.0, 0.0, 0.35)).to_matrix().to_4x4()


def arguments() -> dict:
    argv = sys.argv[sys.argv.index("--") + 1:]
    return {argv[i].lstrip("-"): argv[i + 1] for i in range(0, len(argv), 2)}


def until(condition, what: str, timeout: float):
    """Yield (let Blender run) until condition() holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        yield 0.05


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


def settled_layer(overlay, region, other_than=None):
    """The splats' layer of the viewport's region (not `other_than`) once it shows a full-size frame and waits
    for no other, or None."""
    for (key, _), layer in overlay._layers.items():
        frame = layer.stream.frame
        if key == region.as_pointer() and layer is not other_than and frame is not None and not layer.waiting() \
                and layer.texture_seq == frame.seq and (frame.fields["width"], frame.fields["height"]) == \
                (region.width, region.height):
            return layer
    return None


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
        frame = layer.stream.frame
        np.save(out / f"{name}_rgba.npy", np.round(frame.pixels * 255).astype(np.uint8).reshape(
            frame.fields["height"], frame.fields["width"], 4))
        np.save(out / f"{name}_depth.npy", frame.depth.reshape(frame.fields["height"], frame.fields["width"]))
        view = addon.scene_io.region_camera(region, space.region_3d)
        model = bpy.data.objects[result["session"]]
        taken.update(rgba=str(out / f"{name}_rgba.npy"), depth=str(out / f"{name}_depth.npy"),
                     camera=addon.core.codecs.camera_to_wire(view), background=frame.fields["background"],
                     model_matrix=addon.scene_splats.model_matrix(model).tolist())
    result[name] = taken


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
        yield from until(lambda: finished and not bpy.app.is_job_running("RENDER"), f"the render {name}", 120)
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

    space.shading.type = "WIREFRAME"  # not a shading the splats are drawn in: their frames stop
    yield from until(lambda: not overlay._layers, "no frames in wireframe shading", 10)
    yield from final_renders(addon, out, result)
    bpy.ops.splatwright.backend_stop()
    yield from until(lambda: backend.connection == "disconnected" and not backend.in_flight, "backend stop", 60)
    result["errors"] = backend.last_error


def main() -> None:
    bpy.context.preferences.view.show_splash = False  # read before the splash would open, after this script
    args = arguments()
    result: dict = {}
    steps = scenario(args, result)

    def step():
        try:
            return next(steps)
        except StopIteration:
            pass
        except Exception as e:
            result.update(failure=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        Path(args["out"], "result.json").write_text(json.dumps(result, default=str))
        bpy.ops.wm.quit_blender()
        return None
    bpy.app.timers.register(step, first_interval=0.5)


if __name__ == "__main__":  # as Blender runs it; blender_splats_scenario.py imports the scene from here
    main()

"""Splats in the scene's final renders, in real Blender (the bpy module, 4.5 or 5.0; test_scene_splats_bpy.py runs
it): install the built zip, start a CPU backend that reopens a trained session, Add Model to Scene, move the
model object, and render F12 with Cycles a wall through the model's middle and a cube in front of it (the
scene of blender_splats_gui_scenario.py): hidden
(Blender's own render, also with compositing off), shown (composited by depth), and shown again after the .blend
is saved and opened. Writes the renders, the Depth pass and the splat images into the output folder; prints
`RESULT <json>` for pytest.

    python tests/blender_splats_scenario.py --zip Z --workdir SESSIONS --session NAME --out DIR [--python PY]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import bpy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from blender_scenario import (WithLayout, addon, blender_reports, op, report, stop_and_disable, wait_for,  # noqa: E402
                              pump)  # (it also catches the add-on's timers and Blender's reports)
from blender_splats_gui_scenario import (CUBE_AT, CUBE_COLOR, CUBE_SIZE, MOVE, WALL_COLOR,  # noqa: E402
                                         add_wall_and_cube, render_with_cycles)

SIZE = (80, 60)


def build_scene():
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    add_wall_and_cube(scene)
    render_with_cycles(scene)
    scene.cycles.samples = 4
    scene.render.resolution_x, scene.render.resolution_y = SIZE
    scene.render.image_settings.file_format, scene.render.image_settings.color_mode = "PNG", "RGBA"
    return scene


def add_depth_output(scene, folder: Path) -> None:
    """The Render Layers' Depth pass into a float EXR, through a File Output node added to the compositor."""
    tree = addon().composite.compositor_tree(scene, create=False)
    layers = next(n for n in tree.nodes if n.bl_idname == "CompositorNodeRLayers")
    output = tree.nodes.new("CompositorNodeOutputFile")
    if bpy.app.version >= (5, 0, 0):  # the node names its folder and files apart and has an input per item
        output.directory, output.file_name = str(folder), "depth"
        output.file_output_items.new("FLOAT", "Depth")
        output.format.media_type = "IMAGE"
    else:
        output.base_path = str(folder)
    output.format.file_format, output.format.color_depth, output.format.color_mode = "OPEN_EXR", "32", "RGB"
    tree.links.new(layers.outputs["Depth"], output.inputs[0])


def render(scene, path: Path) -> str:
    scene.render.filepath = str(path)
    bpy.ops.render.render(write_still=True)
    return str(path)


def image_pixels(name: str) -> np.ndarray:
    image = bpy.data.images[name]
    pixels = np.empty(image.size[0] * image.size[1] * 4, np.float32)
    image.pixels.foreach_get(pixels)
    return pixels.reshape(image.size[1], image.size[0], 4)[::-1]  # top-down


def run(zip_path: Path, workdir: Path, session: str, out: Path, python: str) -> dict:
    scene = build_scene()
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    live = addon().live
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = python, str(workdir)
    scene.splatwright.session = session
    op("backend_start")  # reopens the session and its checkpoint
    wait_for(lambda: live.backend.connection == "connected" and live.backend.status.get("gaussians")
             and not live.backend.in_flight, "backend start", 120)
    op("add_model")
    wait_for(lambda: session in bpy.data.objects and not live.backend.in_flight, "Add Model to Scene")
    model = bpy.data.objects[session]
    added = {"location": list(model.location), "display": model.empty_display_type,
             "size": model.empty_display_size, "selected": model.select_get()}
    model.matrix_world = MOVE @ model.matrix_world
    bpy.context.view_layer.update()
    panel = []
    addon().scene_splats.SPLATWRIGHT_PT_scene_splats.draw(WithLayout(None, panel), bpy.context)

    add_depth_output(scene, out / "depth")
    model.hide_render = True
    hidden = render(scene, out / "hidden.png")
    scene.render.use_compositing = False
    raw = render(scene, out / "raw.png")
    scene.render.use_compositing = True
    model.hide_render = False
    shown = render(scene, out / "shown.png")
    np.save(out / "splats.npy", image_pixels(addon().composite.COLOR_IMAGE))
    np.save(out / "splats_depth.npy", image_pixels(addon().composite.DEPTH_IMAGE)[..., 0])
    exr = bpy.data.images.load(str(next((out / "depth").glob("*.exr"))))
    depth = np.empty(exr.size[0] * exr.size[1] * 4, np.float32)
    exr.pixels.foreach_get(depth)
    np.save(out / "depth.npy", depth.reshape(exr.size[1], exr.size[0], 4)[::-1, :, 0])

    kept = model.scale.copy()
    model.scale = (1.0, 2.0, 1.0)  # not a placement splats take: the render goes on without them, saying why
    uneven = render(scene, out / "uneven.png")
    pump()
    model.scale = kept

    scene.render.use_compositing = True
    blend = out / "scene.blend"
    bpy.ops.wm.save_as_mainfile(filepath=str(blend))
    bpy.ops.wm.open_mainfile(filepath=str(blend))
    scene = bpy.context.scene
    reopened = render(scene, out / "reopened.png")
    result = {"added": added, "panel": panel, "hidden": hidden, "raw": raw, "shown": shown, "uneven": uneven,
              "reopened": reopened, "reports": blender_reports.lines,
              "splats": str(out / "splats.npy"), "splats_depth": str(out / "splats_depth.npy"),
              "depth": str(out / "depth.npy"),
              "camera": addon().core.codecs.camera_to_wire(addon().scene_io.camera_of(scene.camera, scene)),
              "model_matrix": addon().scene_splats.model_matrix(bpy.data.objects[session]).tolist(),
              "reopened_object": bpy.data.objects[session].get("splatwright_session"),
              "cube": [list(CUBE_AT), CUBE_SIZE, list(CUBE_COLOR)], "wall_color": list(WALL_COLOR),
              "errors": live.backend.last_error}
    stop_and_disable()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default=sys.executable, help="the backend's Python, with torch")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: run(Path(args.zip), Path(args.workdir), args.session, out, args.python))


if __name__ == "__main__":
    sys.exit(main())

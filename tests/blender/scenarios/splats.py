"""Splats in the scene's final renders, in real Blender (the bpy module, each version; test_scene_splats_bpy.py runs
it): install the built zip, start a CPU backend that reopens a trained session, Add Model to Scene, move the
model object, and render F12 with Cycles a wall through the model's middle and a cube in front of it (the
scene of splat_scene.py, which splats_gui.py shows in a window): hidden (Blender's own render, also with
compositing off), shown (composited by depth), and shown again after the .blend is saved and opened. Then a
second session's model (one the backend does not show) in front of the first, both rendered; the first cropped
by a crop box, rendered alone, and exported cropped and in world space. Writes the renders, the Depth pass, the
splat images and the exports into the output folder; prints `RESULT <json>` for pytest.

    PYTHONPATH=tests python tests/blender/scenarios/splats.py --zip Z --workdir SESSIONS --session NAME \
        --second NAME2 --out DIR [--python PY]
"""
from __future__ import annotations

import sys
from pathlib import Path

import bpy
import numpy as np

from blender.kit import (WithLayout, addon, blender_reports, op, placed_model, pump, session_scenario,
                         stop_and_disable, wait_for)  # (it also catches the add-on's timers and Blender's reports)
from blender.splat_scene import CROP_LOCATION, CROP_SCALE, CUBE_AT, CUBE_COLOR, CUBE_SIZE, MOVE, SECOND_AT, WALL_COLOR


def add_depth_output(scene, folder: Path) -> None:
    """The Render Layers' Depth pass into a float EXR, through a File Output node added to the compositor."""
    tree = addon().render.composite.compositor_tree(scene, create=False)
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


def export(path: Path, **options) -> str:
    op("export_splats", filepath=str(path), **options)
    wait_for(lambda: path.is_file() and not addon().scene.live.backend.in_flight, f"export {path.name}")
    return str(path)


def several_models_and_a_crop_box(scene, session: str, second: str, out: Path) -> dict:
    """A second session's model in front of the first, rendered with it; then the first alone, cropped, rendered
    and exported (cropped, and whole in world space)."""
    splats = addon().scene.splats
    model = bpy.data.objects[session]
    other = splats.add_model_object(bpy.context.view_layer, scene.collection, second, (0.0, 0.0, 0.0), 0.5)
    other.matrix_world = SECOND_AT
    bpy.context.view_layer.update()
    several = render(scene, out / "several.png")
    matrices = {name: splats.model_matrix(bpy.data.objects[name]).tolist() for name in (session, second)}

    other.hide_render = True
    bpy.context.view_layer.objects.active = model
    op("add_crop_box")
    box = bpy.context.view_layer.objects.active
    added_box = {"name": box.name, "parent": box.parent.name, "display": box.empty_display_type,
                 "size": box.empty_display_size, "model_size": model.empty_display_size}
    box.location, box.scale = CROP_LOCATION, CROP_SCALE
    bpy.context.view_layer.update()
    panel = []
    addon().ui.panels.SPLATWRIGHT_PT_model.draw(WithLayout(None, panel), bpy.context)
    cropped = render(scene, out / "cropped.png")
    bpy.context.view_layer.objects.active = box  # the export takes the model of the box's object
    exports = {"cropped": export(out / "cropped.ply", cropped=True),
               "world": export(out / "world.ply", cropped=False, world_space=True)}
    return {"several": several, "matrices": matrices, "crop_box": added_box, "crop_panel": panel,
            "cropped": cropped, "crop": splats.model_choice(model, bpy.context.scene)["crop"].tolist(), "exports": exports}


def run(zip_path: Path, workdir: Path, session: str, out: Path, python: str, second: str) -> dict:
    scene, live, model = placed_model(zip_path, workdir, session, python)
    added = {"location": list(model.location), "display": model.empty_display_type,
             "size": model.empty_display_size, "selected": model.select_get()}
    model.matrix_world = MOVE @ model.matrix_world
    bpy.context.view_layer.update()
    panel = []
    addon().ui.panels.SPLATWRIGHT_PT_model.draw(WithLayout(None, panel), bpy.context)

    add_depth_output(scene, out / "depth")
    model.hide_render = True
    hidden = render(scene, out / "hidden.png")
    scene.render.use_compositing = False
    raw = render(scene, out / "raw.png")
    scene.render.use_compositing = True
    model.hide_render = False
    shown = render(scene, out / "shown.png")
    _, color_image, depth_image = addon().render.composite.rank_names(0)
    np.save(out / "splats.npy", image_pixels(color_image))
    np.save(out / "splats_depth.npy", image_pixels(depth_image)[..., 0])
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
    crop = several_models_and_a_crop_box(scene, session, second, out)
    result = {**crop, "added": added, "panel": panel, "hidden": hidden, "raw": raw, "shown": shown, "uneven": uneven,
              "reopened": reopened, "reports": blender_reports.lines,
              "splats": str(out / "splats.npy"), "splats_depth": str(out / "splats_depth.npy"),
              "depth": str(out / "depth.npy"),
              "camera": addon().core.codecs.camera_to_wire(addon().scene.reading.camera_of(scene.camera, scene)),
              "model_matrix": addon().scene.splats.model_matrix(bpy.data.objects[session]).tolist(),
              "reopened_object": bpy.data.objects[session].get("splatwright_session"),
              "cube": [list(CUBE_AT), CUBE_SIZE, list(CUBE_COLOR)], "wall_color": list(WALL_COLOR),
              "errors": live.backend.last_error}
    stop_and_disable()
    return result


if __name__ == "__main__":
    sys.exit(session_scenario(run, "second"))  # --second: another session with a saved model

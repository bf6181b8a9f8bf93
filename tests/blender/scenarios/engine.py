"""The render engine's final render in real Blender (the bpy module): install the built zip, start a CPU
backend through the add-on, view a PLY, and render F12 with the Splatwright engine, Combined to a PNG and the
Depth pass through the compositor's File Output node, then under other view transforms (VIEWS), keeping the
backend's frames and the view transforms' inverses the add-on made. Then a splat object of a trained session
places its model elsewhere (PLACEMENT): F12 again, and the camera the viewport asks through. With --model4d, a
4D model (splats4d.pt) then goes through File > Import and Export (moving_files). Before the renders, the
imported PLY's session is added to the scene twice and shown by Show Model (imported_session). Prints
`RESULT <json>` for pytest.

    PYTHONPATH=tests python tests/blender/scenarios/engine.py --zip dist/splatwright-X.zip --ply model.ply \
        --session NAME --out DIR [--python PY] [--model4d splats4d.pt]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

import bpy
import numpy as np
from mathutils import Euler, Matrix

from blender.kit import (addon, blender_reports, build_scene, draw_everything, op, report, stop_and_disable,
                         wait_for)  # (also catches the add-on's timers)

SIZE = (80, 60)
BORDER = (0.25, 0.8, 0.1, 0.6)  # render border: min x, max x, min y, max y (fractions, y from the bottom)
# View transforms other than Standard, each rendered once: (view transform, look, exposure, gamma).
VIEWS = (("AgX", "None", 0.0, 1.0), ("Filmic", "Medium High Contrast", 0.5, 1.2))
# Where the splat object puts the model: moved, turned and scaled (a uniform scale multiplies its depths).
PLACEMENT = Matrix.Translation((0.6, -0.4, 0.3)) @ Euler((0.3, -0.2, 0.8)).to_matrix().to_4x4() @ Matrix.Scale(0.8, 4)
SEQUENCE_FRAMES = 3  # the frame range a 4D model is exported over, one file per frame


def compositor(scene):
    """The scene's compositor node tree, empty: scene.node_tree before Blender 5.0, a node group from 5.0 (from 5.3
    that of a compositor effect)."""
    if bpy.app.version >= (5, 0, 0):
        tree = bpy.data.node_groups.new("Compositor", "CompositorNodeTree")
        if hasattr(scene, "compositor_effects"):
            scene.compositor_effects.new(name="Compositor").node_group = tree
        else:
            scene.compositing_node_group = tree
        return tree
    scene.use_nodes = True
    scene.node_tree.nodes.clear()
    return scene.node_tree


def depth_to_file(scene, folder: Path) -> None:
    """Render Layers' Depth into a float EXR through the compositor's File Output node."""
    tree = compositor(scene)
    layers = tree.nodes.new("CompositorNodeRLayers")
    output = tree.nodes.new("CompositorNodeOutputFile")
    if bpy.app.version >= (5, 0, 0):  # the node names its folder and files apart and has an input per item
        output.file_name = "depth"
        output.file_output_items.new("FLOAT", "Depth")
        output.format.media_type = "IMAGE"  # not a multilayer EXR
    depth_folder(scene, folder)
    output.format.file_format, output.format.color_depth, output.format.color_mode = "OPEN_EXR", "32", "RGB"
    tree.links.new(layers.outputs["Depth"], output.inputs[0])
    scene.render.use_compositing = True


def depth_folder(scene, folder: Path) -> None:
    """Where the File Output node writes the Depth pass from now on."""
    tree = addon().render.composite.compositor_tree(scene, create=False)
    output = next(n for n in tree.nodes if n.bl_idname == "CompositorNodeOutputFile")
    if bpy.app.version >= (5, 0, 0):
        output.directory = str(folder)
    else:
        output.base_path = str(folder)


def saved_depth(folder: Path, path: Path) -> str:
    """The Depth pass the File Output node wrote into `folder`, rows top-down, as a .npy at `path`."""
    exr = bpy.data.images.load(str(next(folder.glob("*.exr"))))
    pixels = np.empty(exr.size[0] * exr.size[1] * 4, np.float32)
    exr.pixels.foreach_get(pixels)
    np.save(path, pixels.reshape(exr.size[1], exr.size[0], 4)[::-1, :, 0])
    return str(path)


def keep_frames(engine) -> list:
    """The frames (top-down RGBA8) the engine's renders get from the backend, as they come."""
    frames, fetch = [], engine.SPLATWRIGHT_RE_engine.fetch

    def kept_fetch(self, scene):
        reply, depth_scale = fetch(self, scene)
        frames.append(addon().core.client.decode_frame(reply)[::-1])
        return reply, depth_scale
    engine.SPLATWRIGHT_RE_engine.fetch = kept_fetch
    return frames


def render_views(scene, frames: list, out: Path) -> list[dict]:
    """F12 under each of VIEWS: the PNG, the backend's frame and the inverse the add-on showed it through."""
    views, settings = [], scene.view_settings
    for view in VIEWS:
        settings.view_transform, settings.look, settings.exposure, settings.gamma = view
        name = settings.view_transform.lower()
        scene.render.filepath = str(out / f"{name}.png")
        start = time.perf_counter()
        bpy.ops.render.render(write_still=True)
        seconds = time.perf_counter() - start
        colors = addon().render.view_colors
        inverse = colors.render_inverse(colors.view_key(scene), lambda: False)  # the one the render made
        np.savez(out / f"{name}_inverse.npz", **vars(inverse))
        np.save(out / f"{name}_frame.npy", frames[-1])
        views.append({"view": list(view), "png": str(out / f"{name}.png"),
                      "frame": str(out / f"{name}_frame.npy"), "inverse": str(out / f"{name}_inverse.npz"),
                      "seconds": seconds})
    settings.view_transform = "Standard"
    return views


def placed_render(scene, session: str, out: Path) -> dict:
    """Session `session`'s model, opened by Show Model on a splat object that PLACEMENT moves: F12 with its Depth
    pass, the object's placement, and the camera the viewport asks the backend through for the scene camera's
    view (what engine.placed makes of it)."""
    a, live = addon(), addon().scene.live
    obj = a.scene.splats.add_model_object(bpy.context.view_layer, scene.collection, session, (0.0, 0.0, 0.0), 1.0)
    op("show_model")
    wait_for(lambda: live.backend.status.get("session") == session and live.backend.status.get("gaussians")
             and not live.backend.in_flight, "Show Model")
    obj.matrix_world = PLACEMENT
    bpy.context.view_layer.update()
    scene.render.use_compositing = True
    depth_folder(scene, out / "placed_depth")
    scene.render.filepath = str(out / "placed.png")
    bpy.ops.render.render(write_still=True)
    cam = a.scene.reading.camera_of(scene.camera, scene)
    viewport_cam, _, _ = a.render.engine.placed(scene, cam, session, lambda o: True)
    placed = {"png": str(out / "placed.png"), "depth": saved_depth(out / "placed_depth", out / "placed_depth.npy"),
              "camera": a.core.codecs.camera_to_wire(cam), "model_matrix": a.scene.splats.model_matrix(obj).tolist(),
              "viewport_camera": a.core.codecs.camera_to_wire(viewport_cam)}
    bpy.context.view_layer.objects.active = obj
    op("add_crop_box")
    box = bpy.context.view_layer.objects.active
    box.scale.x *= 0.4  # a slice through the model's middle
    bpy.context.view_layer.update()
    scene.render.filepath = str(out / "cropped.png")
    bpy.ops.render.render(write_still=True)
    placed.update(cropped_png=str(out / "cropped.png"), crop=a.scene.splats.model_choice(obj, bpy.context.scene)["crop"].tolist())
    bpy.data.objects.remove(box)
    return placed


def moving_files(scene, model4d: Path, out: Path) -> dict:
    """A 4D model through File > Import and Export over a frame range of SEQUENCE_FRAMES: the splat object's static
    model as a PLY sequence is refused; with the object gone, Import the 4D model, F12 at the last frame, Export a
    PLY sequence, then at frame 2 one PLY and the model's own .pt file; then Import a frame of a copy of the
    sequence whose manifest says it is incomplete."""
    a, live = addon(), addon().scene.live
    scene.frame_start, scene.frame_end = 1, SEQUENCE_FRAMES
    scene.frame_set(1)
    obj = a.scene.splats.splat_objects(scene)[0]
    bpy.context.view_layer.objects.active = obj
    folder = out / "sequence"
    folder.mkdir()
    reported = len(blender_reports.lines)
    op("export_splats", filepath=str(folder / "still.ply"), sequence=True)
    wait_for(lambda: not live.backend.in_flight, "export a static model as a PLY sequence")
    static_reports = blender_reports.lines[reported:]
    bpy.data.objects.remove(obj)
    may_move = [a.ops.formats.may_move(None)]
    op("import_splats", filepath=str(model4d))
    wait_for(lambda: live.backend.status.get("dynamic") and not live.backend.in_flight, "import the 4D model")
    may_move.append(a.ops.formats.may_move(None))
    scene.frame_set(SEQUENCE_FRAMES)
    scene.render.use_compositing = False
    scene.render.filepath = str(out / "moving.png")
    bpy.ops.render.render(write_still=True)
    scene.frame_set(2)
    reported = len(blender_reports.lines)
    op("export_splats", filepath=str(folder / "moving.ply"), sequence=True)
    op("export_splats", filepath=str(out / "frame2.ply"))
    op("export_splats", filepath=str(out / "copy.pt"))
    wait_for(lambda: not live.backend.in_flight, "export the 4D model")
    result = {"static_reports": static_reports, "may_move": may_move, "png": str(out / "moving.png"),
              "folder": str(folder), "files": sorted(p.name for p in folder.iterdir()),
              "frame2": str(out / "frame2.ply"), "copy": str(out / "copy.pt"),
              "reports": blender_reports.lines[reported:],
              "camera": a.core.codecs.camera_to_wire(a.scene.reading.camera_of(scene.camera, scene))}
    # A copy of the sequence as a Blender that died while putting its frames in place leaves it; import a frame.
    died = out / "died"
    shutil.copytree(folder, died)
    files = a.core.files
    files.begin_sequence(died / "moving.ply", files.sequence_paths(died / "moving.ply", SEQUENCE_FRAMES))
    reported = len(blender_reports.lines)
    op("import_splats", filepath=str(died / "moving_0001.ply"))
    wait_for(lambda: not live.backend.in_flight, "import a frame of an incomplete sequence")
    result["incomplete_reports"] = blender_reports.lines[reported:]
    return result


def imported_session(scene, trained: str) -> dict:
    """The session the PLY's import made: the panels drawn, Add Model to Scene pressed twice; then with the
    trained session `trained` open, Show Model on the imported model's object, its load held until the panels
    are drawn (the session open, its model not loaded yet). The objects are removed again."""
    a, live = addon(), addon().scene.live
    session = live.backend.status["session"]
    result = {"session": session, "drawn": draw_everything()}
    reported = len(blender_reports.lines)
    for _ in range(2):
        op("add_model")
        wait_for(lambda: not live.backend.in_flight, "Add Model to Scene")
    result["add_reports"] = blender_reports.lines[reported:]
    placed = [o for o in a.scene.splats.splat_objects(scene) if o[a.scene.splats.SESSION_KEY] == session]
    result["objects"] = [o.name for o in placed]

    other = a.scene.splats.add_model_object(bpy.context.view_layer, scene.collection, trained, (0.0, 0.0, 0.0), 1.0)
    op("show_model")
    wait_for(lambda: live.backend.status.get("session") == trained and not live.backend.in_flight, "Show Model")
    real_open, drawn = a.ops.splats.open_model, threading.Event()

    def held_open(client, name):  # on the worker: the session opens, its model loads once the panels are drawn
        client.call("open_session", name=name, create=False)
        drawn.wait(60)
        return real_open(client, name)
    a.ops.splats.open_model = held_open
    try:
        bpy.context.view_layer.objects.active = placed[0]
        op("show_model")
        wait_for(lambda: live.backend.status.get("session") == session, "the imported session opens")
        result["drawn_loading"] = draw_everything()
    finally:
        drawn.set()
        a.ops.splats.open_model = real_open
    wait_for(lambda: live.backend.status.get("gaussians") and not live.backend.in_flight, "its model loads")
    result["drawn_loaded"] = draw_everything()
    for obj in (*placed, other):
        bpy.data.objects.remove(obj)
    return result


def run(zip_path: Path, ply: Path, session: str, out: Path, python: str, model4d: Path | None) -> dict:
    build_scene()
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    live = addon().scene.live
    frames = keep_frames(addon().render.engine)
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = python, str(out / "sessions")
    op("backend_start")
    wait_for(lambda: live.backend.connection == "connected", "backend start", 120)
    op("import_splats", filepath=str(ply))
    wait_for(lambda: live.backend.status.get("gaussians") and not live.backend.in_flight, "load PLY")
    scene = bpy.context.scene
    imported = imported_session(scene, session)

    scene.render.engine = "SPLATWRIGHT"
    scene.render.resolution_x, scene.render.resolution_y = SIZE
    scene.render.image_settings.file_format = "PNG"
    scene.render.image_settings.color_mode = "RGBA"
    scene.view_settings.view_transform = "Standard"
    scene.view_layers[0].use_pass_z = True
    depth_to_file(scene, out / "depth")
    scene.render.filepath = str(out / "f12.png")
    start = time.perf_counter()
    bpy.ops.render.render(write_still=True)
    seconds = time.perf_counter() - start
    saved_depth(out / "depth", out / "depth.npy")
    cam = addon().scene.reading.camera_of(scene.camera, scene)
    scene.render.use_compositing = False
    scene.render.use_border = True
    scene.render.border_min_x, scene.render.border_max_x = BORDER[0], BORDER[1]
    scene.render.border_min_y, scene.render.border_max_y = BORDER[2], BORDER[3]
    for crop in (True, False):
        scene.render.use_crop_to_border = crop
        scene.render.filepath = str(out / f"border_crop{int(crop)}.png")
        bpy.ops.render.render(write_still=True)
    scene.render.use_border = False
    views = render_views(scene, frames, out)
    placed = placed_render(scene, session, out)
    result = {"png": str(out / "f12.png"), "border": BORDER, "depth": str(out / "depth.npy"), "seconds": seconds,
              "camera": addon().core.codecs.camera_to_wire(cam), "views": views, "placed": placed,
              "imported": imported, "errors": live.backend.last_error}
    if model4d is not None:
        result["moving"] = moving_files(scene, model4d, out)
    stop_and_disable()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--ply", required=True)
    parser.add_argument("--session", required=True, help="a trained session in OUT/sessions, placed by an object")
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default=sys.executable, help="the backend's Python, with torch")
    parser.add_argument("--model4d", help="a 4D model file (splats4d.pt) to import and export")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: run(Path(args.zip), Path(args.ply), args.session, out, args.python,
                              Path(args.model4d) if args.model4d else None))


if __name__ == "__main__":
    sys.exit(main())

"""The render engine's final render in real Blender (the bpy module): install the built zip, start a CPU
backend through the add-on, view a PLY, and render F12 with the Splatwright engine, Combined to a PNG and the
Depth pass through the compositor's Viewer node, then under other view transforms (VIEWS), keeping the
backend's frames and the view transforms' inverses the add-on made. Prints `RESULT <json>` for pytest.

    python tests/blender_engine_scenario.py --zip dist/splatwright-X.zip --ply model.ply --out DIR [--python PY]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import bpy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from blender_scenario import addon, build_scene, op, report, stop_and_disable, wait_for  # noqa: E402  (also catches the add-on's timers)

SIZE = (80, 60)
BORDER = (0.25, 0.8, 0.1, 0.6)  # render border: min x, max x, min y, max y (fractions, y from the bottom)
# View transforms other than Standard, each rendered once: (view transform, look, exposure, gamma).
VIEWS = (("AgX", "None", 0.0, 1.0), ("Filmic", "Medium High Contrast", 0.5, 1.2))


def compositor(scene):
    """The scene's compositor node tree, empty: scene.node_tree before Blender 5.0, a node group from 5.0."""
    if bpy.app.version >= (5, 0, 0):
        scene.compositing_node_group = bpy.data.node_groups.new("Compositor", "CompositorNodeTree")
        return scene.compositing_node_group
    scene.use_nodes = True
    scene.node_tree.nodes.clear()
    return scene.node_tree


def depth_to_file(scene, folder: Path) -> None:
    """Render Layers' Depth into a float EXR through the compositor's File Output node."""
    tree = compositor(scene)
    layers = tree.nodes.new("CompositorNodeRLayers")
    output = tree.nodes.new("CompositorNodeOutputFile")
    if bpy.app.version >= (5, 0, 0):  # the node names its folder and files apart and has an input per item
        output.directory, output.file_name = str(folder), "depth"
        output.file_output_items.new("FLOAT", "Depth")
        output.format.media_type = "IMAGE"  # not a multilayer EXR
    else:
        output.base_path = str(folder)
    output.format.file_format, output.format.color_depth, output.format.color_mode = "OPEN_EXR", "32", "RGB"
    tree.links.new(layers.outputs["Depth"], output.inputs[0])
    scene.render.use_compositing = True


def keep_frames(engine) -> list:
    """The frames (top-down RGBA8) the engine's renders get from the backend, as they come."""
    frames, fetch = [], engine.SPLATWRIGHT_RE_engine.fetch

    def kept_fetch(self, scene):
        reply = fetch(self, scene)
        frames.append(addon().core.client.decode_frame(reply)[::-1])
        return reply
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
        colors = addon().view_colors
        inverse = colors.render_inverse(colors.view_key(scene), lambda: False)  # the one the render made
        np.savez(out / f"{name}_inverse.npz", **vars(inverse))
        np.save(out / f"{name}_frame.npy", frames[-1])
        views.append({"view": list(view), "png": str(out / f"{name}.png"),
                      "frame": str(out / f"{name}_frame.npy"), "inverse": str(out / f"{name}_inverse.npz"),
                      "seconds": seconds})
    settings.view_transform = "Standard"
    return views


def run(zip_path: Path, ply: Path, out: Path, python: str) -> dict:
    build_scene()
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    live = addon().live
    frames = keep_frames(addon().engine)
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = python, str(out / "sessions")
    op("backend_start")
    wait_for(lambda: live.backend.connection == "connected", "backend start", 120)
    op("import_splats", filepath=str(ply))
    wait_for(lambda: live.backend.status.get("gaussians") and not live.backend.in_flight, "load PLY")

    scene = bpy.context.scene
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
    exr = bpy.data.images.load(str(next((out / "depth").glob("*.exr"))))
    pixels = np.empty(exr.size[0] * exr.size[1] * 4, np.float32)
    exr.pixels.foreach_get(pixels)
    np.save(out / "depth.npy", pixels.reshape(exr.size[1], exr.size[0], 4)[::-1, :, 0])  # top-down
    cam = addon().scene_io.camera_of(scene.camera, scene)
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
    result = {"png": str(out / "f12.png"), "border": BORDER, "depth": str(out / "depth.npy"), "seconds": seconds,
              "camera": addon().core.codecs.camera_to_wire(cam), "views": views,
              "errors": live.backend.last_error}
    stop_and_disable()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--ply", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default=sys.executable, help="the backend's Python, with torch")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: run(Path(args.zip), Path(args.ply), out, args.python))


if __name__ == "__main__":
    sys.exit(main())

"""A 4D model as Blender's own splats, in real Blender 5.3 or later (the bpy module; test_native4d_bpy.py runs it):
install the built zip, make a native splat object of a 4D model's attributes (logic/native.motion_attributes) as
Add Model to Scene does (scene/native.write and animate), and at the first, a middle and the last frame of the
scene's range keep what Blender evaluates (the motion modifier's positions and rotations, the frame handler's
opacities) and render it with Cycles; a static object of the model at the first frame's time is rendered beside
it; then, in a range of three frames, the middle frame sharp and with Cycles' motion blur. No backend runs. Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/native4d.py --zip Z --job JOB.json --out DIR

JOB.json: {"model": NPZ of the 4D attributes, "static": NPZ of the static attributes, "frames": [start, end],
           "middle": [frame, subframe], "camera": formation.blender_camera's dict, "samples": N}
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import bpy
import numpy as np
from mathutils import Matrix

from blender.kit import addon, report


def attributes(path: str) -> dict:
    with np.load(path) as data:
        return {name.replace("__", ":"): data[name] for name in data.files}


def keep(values: dict, path: Path) -> str:
    np.savez(path, **{name.replace(":", "__"): v for name, v in values.items()})
    return str(path)


def render(scene, path: Path) -> str:
    scene.render.filepath = str(path.with_suffix(".exr"))
    bpy.ops.render.render(write_still=True)
    image = bpy.data.images.load(scene.render.filepath)
    pixels = np.array(image.pixels[:], np.float32).reshape(scene.render.resolution_y, scene.render.resolution_x, 4)
    bpy.data.images.remove(image)
    np.save(path, pixels[::-1])
    return str(path)


def run(zip_path: Path, job: dict, out: Path) -> dict:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    native = addon().scene.native
    scene = bpy.context.scene
    scene.frame_start, scene.frame_end = job["frames"]
    world = bpy.data.worlds.new("black")
    scene.world = world
    if world.node_tree is None:
        world.use_nodes = True
    next(n for n in world.node_tree.nodes if n.type == "BACKGROUND").inputs["Color"].default_value = (0, 0, 0, 1)
    scene.view_settings.view_transform, scene.view_settings.look = "Standard", "None"
    scene.render.engine = "CYCLES"
    scene.cycles.device, scene.cycles.samples, scene.cycles.use_denoising = "CPU", job["samples"], False
    scene.cycles.use_adaptive_sampling = False
    scene.render.image_settings.file_format, scene.render.image_settings.color_depth = "OPEN_EXR", "32"
    c = job["camera"]
    camera = bpy.data.objects.new("camera", bpy.data.cameras.new("camera"))
    camera.matrix_world = Matrix(c["c2w"])
    lens = camera.data
    lens.lens, lens.sensor_width, lens.sensor_height = c["lens"], c["sensor_width"], c["sensor_height"]
    lens.sensor_fit, lens.shift_x, lens.shift_y, lens.clip_start = c["sensor_fit"], c["shift_x"], c["shift_y"], 0.01
    scene.render.resolution_x, scene.render.resolution_y, scene.render.resolution_percentage = c["width"], c["height"], 100
    scene.collection.objects.link(camera)
    scene.camera = camera

    objects = {}
    for name in ("model", "static"):
        cloud = bpy.data.pointclouds.new(name)
        native.write(cloud, attributes(job[name]))
        objects[name] = bpy.data.objects.new(name, cloud)
        scene.collection.objects.link(objects[name])
    native.animate(objects["model"], scene)
    result = {"modifiers": [m.name for m in objects["model"].modifiers], "shown": {}, "renders": {}}
    frames = {"start": (job["frames"][0], 0.0), "middle": tuple(job["middle"]), "end": (job["frames"][1], 0.0)}
    for what, (frame, subframe) in frames.items():
        scene.frame_set(int(frame), subframe=subframe)
        shown = objects["model"].evaluated_get(bpy.context.evaluated_depsgraph_get()).data
        result["shown"][what] = keep(native.read(shown), out / f"shown_{what}.npz")
        result["evaluated_type"] = shown.type
        if what != "middle":
            objects["static"].hide_render = True
            result["renders"][what] = render(scene, out / f"model_{what}.npy")
    scene.frame_set(job["frames"][0])
    objects["model"].hide_render, objects["static"].hide_render = True, False
    result["renders"]["static"] = render(scene, out / "static_start.npy")
    # Cycles' motion blur over a shutter of a whole frame in a range of three frames: the middle frame's shutter
    # spans half the clip, as the drivers follow the range.
    objects["model"].hide_render, objects["static"].hide_render = False, True
    scene.frame_start, scene.frame_end = 1, 3
    scene.frame_set(2)
    result["renders"]["sharp"] = render(scene, out / "model_sharp.npy")
    scene.render.use_motion_blur, scene.render.motion_blur_shutter = True, 1.0
    result["renders"]["blurred"] = render(scene, out / "model_blurred.npy")
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("zip", "job", "out"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: run(Path(args.zip), json.loads(Path(args.job).read_text()), out))


if __name__ == "__main__":
    raise SystemExit(main())

"""Blender's own renders of a splat file, for `python -m backend bench formation` (formation.py): the file through
Blender's PLY importer (a native GAUSSIAN_SPLAT point cloud, bpy 5.3 or later), or a 4D model's PLY with its motion
(backend/service/exports.motion_ply_bytes) put in the scene as Add Model to Scene puts it (the add-on's modules from
the checkout on PYTHONPATH), rendered by Cycles on the CPU or EEVEE through each camera of a job file, each at its
frame, over a world of one colour ("keys" animate the imported object: its world matrix keyed at those frames).
Each render is kept as its linear RGBA, rows top-down, as OUT_<render>_<view>.npy, and as its display values (RGB)
under each view transform the job names, as OUT_<render>_<view>_<transform>.npy. Linear RGB(A) arrays the job lists
under "display" get their display values the same way, beside them as <array>_<transform>.npy.

    python backend/tools/bench/blender_formation.py JOB.json

JOB.json: {"ply": PATH, or "motion_ply": PATH, "background": [r, g, b] (linear), "out": PREFIX,
           "frame_range": [start, end], "keys": {frame: 4x4, ...} (optional),
           "cameras": [{"c2w": Blender camera-to-world 4x4, "lens", "sensor_width", "sensor_height", "sensor_fit",
                        "shift_x", "shift_y", "width", "height", "pixel_aspect_x", "pixel_aspect_y",
                        "frame" (optional)}, ...],
           "renders": [{"name", "engine": CYCLES|BLENDER_EEVEE, "samples", "filter_width", "seed"}, ...],
           "view_transforms": ["Standard", "AgX", ...], "display": [NPY, ...]}
Prints `RESULT <json>` with Blender's version and each render's seconds.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import bpy
import numpy as np
from mathutils import Matrix

from blender_addon.core.splats import read_motion_ply_bytes  # the checkout is on PYTHONPATH (formation.py)
from blender_addon.logic.native import native_attributes
from blender_addon.scene import native
from blender_addon.scene.splats import add_native_object


def add_moving_model(path: str, scene):
    """The 4D model in the PLY at `path` as Add Model to Scene adds a session's (ops/base.add_model_to_scene): its
    native attributes in a new native splat object, animated over the scene's frame range."""
    model, motion = read_motion_ply_bytes(open(path, "rb").read(), path)
    if motion is None:
        raise SystemExit(f"{path} holds no motion: a 4D model's PLY has its motion columns")
    obj = add_native_object(bpy.context.view_layer, scene.collection, "model", native_attributes(model, motion), 0)
    native.register()  # the add-on's frame handler, which sets the opacities at each frame
    native.animate(obj, scene)
    return obj


def keyed(obj, keys: dict) -> None:
    """`obj`'s world matrix keyed at each frame of `keys` (its location, rotation and scale)."""
    for frame, matrix in keys.items():
        obj.matrix_world = Matrix(matrix)
        for path in ("location", "rotation_euler", "scale"):
            obj.keyframe_insert(path, frame=int(frame))


def set_up(job: dict):
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    scene.frame_start, scene.frame_end = job.get("frame_range", (1, 1))
    if "motion_ply" in job:
        cloud = add_moving_model(job["motion_ply"], scene)
    else:
        bpy.ops.wm.ply_import(filepath=job["ply"])
        cloud = next(o for o in scene.objects if o.type == "POINTCLOUD")
    if getattr(cloud.data, "type", None) != "GAUSSIAN_SPLAT":
        raise SystemExit(f"Blender {bpy.app.version_string} imported {job.get('ply')} as a plain point cloud; "
                         "native splats need Blender 5.3 or later")
    keyed(cloud, job.get("keys", {}))
    world = bpy.data.worlds.new("background")
    scene.world = world
    if world.node_tree is None:
        world.use_nodes = True
    node = next(n for n in world.node_tree.nodes if n.type == "BACKGROUND")
    node.inputs["Color"].default_value = (*job["background"], 1.0)
    node.inputs["Strength"].default_value = 1.0
    scene.view_settings.look = "None"
    scene.render.resolution_percentage = 100
    camera = bpy.data.objects.new("camera", bpy.data.cameras.new("camera"))
    scene.collection.objects.link(camera)
    scene.camera = camera
    return scene, camera, len(cloud.data.points)


def place(scene, camera, c: dict) -> None:
    scene.frame_set(c.get("frame", scene.frame_start))
    camera.matrix_world = Matrix(c["c2w"])
    lens = camera.data
    lens.lens, lens.sensor_width, lens.sensor_height = c["lens"], c["sensor_width"], c["sensor_height"]
    lens.sensor_fit, lens.shift_x, lens.shift_y = c["sensor_fit"], c["shift_x"], c["shift_y"]
    lens.clip_start = 0.01
    scene.render.resolution_x, scene.render.resolution_y = c["width"], c["height"]
    scene.render.pixel_aspect_x, scene.render.pixel_aspect_y = c["pixel_aspect_x"], c["pixel_aspect_y"]


def configure(scene, r: dict) -> None:
    scene.render.engine = r["engine"]
    if r["engine"] == "CYCLES":
        scene.cycles.device = "CPU"
        scene.cycles.samples = r["samples"]
        scene.cycles.use_denoising = False
        scene.cycles.use_adaptive_sampling = False
        scene.cycles.filter_width = r["filter_width"]
        scene.cycles.seed = r.get("seed", 0)
    else:
        scene.eevee.taa_render_samples = r["samples"]
        scene.render.filter_size = r["filter_width"]


def display_values(scene, linear: np.ndarray, view_transform: str) -> np.ndarray:
    """Blender's display values (H, W, 3) of a linear (H, W, 3 or 4) image, rows top-down, under `view_transform`
    (look None, exposure 0): Image.save_render to a 16-bit PNG through the scene's colour management."""
    height, width = linear.shape[:2]
    rgba = np.ones((height, width, 4), np.float32)
    rgba[..., :3] = linear[..., :3]
    scene.view_settings.view_transform = view_transform
    out = scene.render.image_settings
    out.file_format, out.color_mode, out.color_depth, out.compression = "PNG", "RGB", "16", 0
    scene.render.dither_intensity = 0.0
    handle, path = tempfile.mkstemp(suffix=".png")
    os.close(handle)
    image = bpy.data.images.new("linear", width, height, alpha=True, float_buffer=True)
    image.pixels.foreach_set(rgba[::-1].reshape(-1))
    image.save_render(path, scene=scene)
    shown = bpy.data.images.load(path)
    shown.colorspace_settings.name = "Non-Color"  # the file's values as they are
    values = np.empty(width * height * 4, np.float32)
    shown.pixels.foreach_get(values)
    for made in (image, shown):
        bpy.data.images.remove(made)
    os.remove(path)
    return values.reshape(height, width, 4)[::-1, :, :3]


def save_display(scene, linear: np.ndarray, prefix: str, view_transforms: list[str]) -> None:
    for view_transform in view_transforms:
        np.save(f"{prefix}_{view_transform}.npy", display_values(scene, linear, view_transform))


def main(job_path: str) -> None:
    job = json.loads(open(job_path).read())
    scene, camera, count = set_up(job)
    view_transforms = job.get("view_transforms", [])
    seconds = {}
    for r in job["renders"]:
        configure(scene, r)
        for i, c in enumerate(job["cameras"]):
            place(scene, camera, c)
            scene.view_settings.view_transform = "Standard"
            scene.render.image_settings.file_format = "OPEN_EXR"
            scene.render.image_settings.color_depth = "32"
            path = f"{job['out']}_{r['name']}_{i}.exr"
            scene.render.filepath = path
            start = time.perf_counter()
            bpy.ops.render.render(write_still=True)
            seconds.setdefault(r["name"], []).append(time.perf_counter() - start)
            image = bpy.data.images.load(path)
            pixels = np.array(image.pixels[:], dtype=np.float32).reshape(c["height"], c["width"], 4)[::-1]
            np.save(f"{job['out']}_{r['name']}_{i}.npy", pixels)
            bpy.data.images.remove(image)
            save_display(scene, pixels, f"{job['out']}_{r['name']}_{i}", view_transforms)
    for array in job.get("display", []):
        save_display(scene, np.load(array), array.removesuffix(".npy"), view_transforms)
    print("RESULT " + json.dumps({"blender": bpy.app.version_string, "splats": count, "seconds": seconds}))


if __name__ == "__main__":
    main(sys.argv[-1])

"""The Blender side of `python -m backend bench native4d` (native4d.py), in a bpy 5.3 process with the checkout on
PYTHONPATH: a native splat object of the 4D model's attributes in NPZ, set up as the add-on sets one up
(blender_addon/scene/native.py: write, animate, the opacity handler), and `scene.frame_set` timed over FRAMES
frames of a 1-250 range, the opacity handler timed inside it; then its parts and the numpy-handler alternative.
Prints `RESULT <json>`.

    PYTHONPATH=. python backend/tools/bench/blender_native4d.py MODEL.npz FRAMES
"""
from __future__ import annotations

import json
import sys
import time

import bpy
import numpy as np

from blender_addon.logic import native as conventions
from blender_addon.scene import native


def timed(fn, count: int) -> dict:
    fn(0)  # warm-up
    seconds = []
    for i in range(1, count + 1):
        start = time.perf_counter()
        fn(i)
        seconds.append(time.perf_counter() - start)
    return summary(seconds)


def summary(seconds: list[float]) -> dict:
    ms = 1000 * np.array(seconds)
    return {"median_ms": float(np.median(ms)), "p95_ms": float(np.percentile(ms, 95)), "max_ms": float(ms.max())}


def main(path: str, frames: int) -> None:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    scene.frame_start, scene.frame_end = 1, 250
    with np.load(path) as data:
        attributes = {name.replace("__", ":"): data[name] for name in data.files}
    cloud = bpy.data.pointclouds.new("model")
    native.write(cloud, attributes)
    obj = bpy.data.objects.new("model", cloud)
    scene.collection.objects.link(obj)
    native.register()
    native.animate(obj, scene)
    step = max(1, 240 // (frames + 1))
    handler = []  # the opacity handler's seconds in each frame_set, timed where Blender calls it

    def update_opacities(scene, depsgraph=None):
        start = time.perf_counter()
        native.update_opacities(scene, depsgraph)
        handler.append(time.perf_counter() - start)
    handlers = bpy.app.handlers.frame_change_pre
    handlers[handlers.index(native.update_opacities)] = update_opacities
    timings = {"frame_set": timed(lambda i: scene.frame_set(2 + step * i), frames)}
    timings["opacity handler, in frame_set"] = summary(handler[-frames:])
    handlers[handlers.index(update_opacities)] = native.update_opacities
    native.unregister()
    timings["frame_set, motion modifier alone"] = timed(lambda i: scene.frame_set(2 + step * i), frames)
    obj.modifiers.clear()
    centre = {**attributes}

    def write_all(scene, depsgraph=None):
        shown = conventions.motion_at(centre, native.scene_time(scene))
        for name in (conventions.POSITION, conventions.ROTATION, conventions.BASE):
            cloud.attributes[name].data.foreach_set(conventions.attribute_kind(name).field, shown[name].ravel())
        cloud.update_tag()
    bpy.app.handlers.frame_change_pre.append(write_all)
    timings["frame_set, numpy handler instead"] = timed(lambda i: scene.frame_set(2 + step * i), frames)
    print("RESULT " + json.dumps({"blender": bpy.app.version_string, "points": len(cloud.points), "timings": timings}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

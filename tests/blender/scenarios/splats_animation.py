"""Splats in an animation render, in real Blender (the bpy module, each version; test_splats_animation.py runs it):
install the built zip, start a CPU backend that reopens a trained session, Add Model to Scene, keyframe the scene
camera and the model object to move on each of FRAMES frames, and render the animation with Cycles (the scene of
splat_scene.py: a wall through the model's middle, a cube in front of it) with the model object left out and
with it. Each frame's camera and model placement, as Blender evaluates them at that frame, are kept for
pytest. Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/splats_animation.py --zip Z --workdir SESSIONS --session NAME \
        --out DIR [--python PY]
"""
from __future__ import annotations

import sys
from pathlib import Path

import bpy
from mathutils import Euler, Matrix, Vector

from blender.kit import addon, blender_reports, placed_model, session_scenario, stop_and_disable  # (catches timers)
from blender.splat_scene import LOOK_AT, WALL_COLOR

# Per frame: where the camera is (it looks at LOOK_AT), and how the model object is moved from where it was added.
CAMERA_PATH = ((0.0, -6.0, 0.6), (0.9, -5.7, 1.0), (-0.8, -5.4, 0.3))
MODEL_PATH = (Matrix.Identity(4),
              Matrix.Translation((-0.3, 0.0, -0.2)) @ Euler((0.0, 0.0, 0.35)).to_matrix().to_4x4(),
              Matrix.Translation((0.25, -0.3, 0.15)) @ Euler((0.2, 0.0, -0.3)).to_matrix().to_4x4()
              @ Matrix.Scale(1.2, 4))
FRAMES = len(CAMERA_PATH)


def keyframe_motion(scene, model) -> None:
    """The camera and the model object keyframed on frames 1 to FRAMES along CAMERA_PATH and MODEL_PATH."""
    camera, added = scene.camera, model.matrix_world.copy()
    for frame, (at, move) in enumerate(zip(CAMERA_PATH, MODEL_PATH), start=1):
        camera.location = at
        camera.rotation_euler = (Vector(LOOK_AT) - Vector(at)).to_track_quat("-Z", "Y").to_euler()
        model.matrix_world = move @ added
        for obj, paths in ((camera, ("location", "rotation_euler")), (model, ("location", "rotation_euler", "scale"))):
            for path in paths:
                obj.keyframe_insert(path, frame=frame)
    scene.frame_start, scene.frame_end = 1, FRAMES


def poses(scene, model) -> list[dict]:
    """Each frame's scene camera (wire form) and model placement, as Blender evaluates that frame."""
    a, kept = addon(), scene.frame_current
    frames = []
    for frame in range(1, FRAMES + 1):
        scene.frame_set(frame)
        frames.append({"camera": a.core.codecs.camera_to_wire(a.scene.reading.camera_of(scene.camera, scene)),
                       "model_matrix": a.scene.splats.model_matrix(model).tolist()})
    scene.frame_set(kept)
    return frames


def render_animation(scene, out: Path, name: str) -> list[str]:
    scene.render.filepath = str(out / f"{name}_")
    bpy.ops.render.render(animation=True)
    return [str(out / f"{name}_{frame:04d}.png") for frame in range(1, FRAMES + 1)]


def run(zip_path: Path, workdir: Path, session: str, out: Path, python: str) -> dict:
    scene, live, model = placed_model(zip_path, workdir, session, python)
    keyframe_motion(scene, model)
    scene.frame_set(1)
    frames = poses(scene, model)

    model.hide_render = True
    hidden = render_animation(scene, out, "hidden")
    model.hide_render = False
    shown = render_animation(scene, out, "shown")
    result = {"frames": frames, "hidden": hidden, "shown": shown, "wall_color": list(WALL_COLOR),
              "reports": blender_reports.lines, "errors": live.backend.last_error}
    stop_and_disable()
    return result


if __name__ == "__main__":
    sys.exit(session_scenario(run))

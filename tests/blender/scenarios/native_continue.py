"""Training continues from an edited native splat object, in real Blender 5.3 or later (the bpy module;
test_native_continue_bpy.py runs it): install the built zip, start a CPU backend that reopens a session trained
part of its schedule, Add Model to Scene, delete points of the object in Edit Mode, move some, place the object
elsewhere, crop it with Add Crop Box, and Start Training (Continue From It): what the object shows is what training
continues from, and the object then follows the model trained on from it. Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/native_continue.py --zip Z --workdir SESSIONS --session NAME \
        --out DIR [--python PY]
"""
from __future__ import annotations

import sys
from pathlib import Path

import bpy
import numpy as np
from mathutils import Euler, Matrix

from blender.kit import (addon, blender_reports, delete_last_points, op, placed_model, session_scenario,
                         stop_and_disable, wait_for)

DELETED = 60  # the last points, deleted in Edit Mode
MOVED, SHIFT = 5, (0.3, 0.0, -0.2)  # the first points, moved in the object's space
PLACEMENT = Matrix.Translation((0.5, -0.3, 0.2)) @ Euler((0.2, 0.1, 0.7)).to_matrix().to_4x4()  # the object's


def run(zip_path: Path, workdir: Path, session: str, out: Path, python: str) -> dict:
    scene, live, model = placed_model(zip_path, workdir, session, python)
    following = addon().scene.following
    result = {"points": len(model.data.points), "step": live.backend.status["step"],
              "edited_as_added": following.edited_object(bpy.context, session) is not None}
    delete_last_points(model, DELETED)
    positions = addon().scene.native.positions(model.data)
    positions[:MOVED] += np.array(SHIFT, np.float32)
    model.data.attributes["position"].data.foreach_set("vector", positions.ravel())
    model.data.update_tag()
    model.matrix_world = PLACEMENT  # moves the model in the scene, not within it
    bpy.context.view_layer.objects.active = model
    op("add_crop_box")  # around the points, which it crops (as the object's crop modifier shows them)
    box = bpy.context.view_layer.objects.active
    bpy.context.view_layer.update()
    shown = addon().scene.native.positions(model.evaluated_get(bpy.context.evaluated_depsgraph_get()).data)
    np.save(out / "shown.npy", shown)
    edited = following.edited_object(bpy.context, session)
    result.update(edited=edited.name if edited is not None else None, edited_points=len(model.data.points),
                  shown=str(out / "shown.npy"))
    seen = []  # (state, step, Gaussians) of the backend's status while it trains

    def finished() -> bool:
        status = live.backend.status
        seen.append((status.get("state"), status.get("step"), status.get("gaussians")))
        return status.get("state") == "finished" and not live.backend.in_flight

    op("train_start", start="CONTINUE")
    wait_for(finished, "training", 120)
    status = live.backend.status
    wait_for(lambda: model.get("splatwright_step") == status["step"], "the object to follow the model", 30)
    bpy.data.objects.remove(box)  # its crop modifier then keeps every point
    bpy.context.view_layer.update()
    result.update(seen=seen, finished=dict(status), followed_points=len(model.data.points),
                  edited_after_following=following.edited_object(bpy.context, session) is not None,
                  errors=live.backend.last_error)
    stop_and_disable()
    result.update(reports=blender_reports.lines)
    return result


if __name__ == "__main__":
    sys.exit(session_scenario(run))

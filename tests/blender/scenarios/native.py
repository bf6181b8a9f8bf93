"""Native splats, in real Blender 5.3 or later (the bpy module; test_native_bpy.py runs it): install the built
zip, start a CPU backend that reopens a trained session, Add Model to Scene, which makes Blender's own splat
object of the model; the object's attributes are kept for pytest beside those Blender's own PLY importer makes
of its export. Export Splats writes what the object shows: moved, turned and scaled (in world space, as SPZ),
and after points are taken away; cropped by Add Crop Box (a Geometry Nodes modifier) with points deleted in Edit
Mode, as the object shows itself; and in world space under a parent that makes its world matrix shear. The scene is rendered with Cycles with the object hidden and shown (no
compositor set-up, no backend in the render). Training on, the object follows the model. Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/native.py --zip Z --workdir SESSIONS --session NAME --out DIR \
        [--python PY]
"""
from __future__ import annotations

import sys
from pathlib import Path

import bpy
import numpy as np
from mathutils import Euler, Matrix, Vector

from blender.kit import (addon, blender_reports, delete_last_points, drawn_buttons, op, placed_model,
                         session_scenario, stop_and_disable, wait_for)

PLACEMENT = Matrix.Translation((0.4, -0.2, 0.3)) @ Euler((0.3, -0.2, 0.9)).to_matrix().to_4x4() @ Matrix.Scale(1.5, 4)
KEPT = 200  # the points left after "deleting" the rest
DELETED = 40  # the last points, deleted in Edit Mode under the crop box
# the crop box moved, turned and scaled unevenly in its parent's (the object's) space
BOX_LOCATION, BOX_ROTATION, BOX_SCALE = (0.1, -0.05, 0.05), (0.3, -0.2, 0.5), (0.7, 1.1, 0.5)
# a parent scaled unevenly, and the object turned and scaled under it: a world matrix that shears
PARENT = Matrix.Translation((0.5, 0.1, -0.2)) @ Euler((0.1, 0.2, 0.3)).to_matrix().to_4x4() @ Matrix.Diagonal((1.0, 1.8, 0.6, 1.0))
CHILD = Matrix.Translation((0.2, -0.3, 0.1)) @ Euler((0.4, -0.5, 0.7)).to_matrix().to_4x4() @ Matrix.Diagonal((1.3, 0.8, 1.0, 1.0))
TRAINED_STEPS = 30


def attributes_file(cloud, path: Path) -> str:
    np.savez(path, **{name.replace(":", "__"): values for name, values in addon().scene.native.read(cloud).items()})
    return str(path)


def export(live, model, path: Path, **options) -> None:
    bpy.context.view_layer.objects.active = model
    op("export_splats", filepath=str(path), **options)
    wait_for(lambda: not live.backend.in_flight, f"export {path.name}")


def follow_training(scene, live, model) -> dict:
    """Train a new model for a few steps: the object follows the model as the training moves it on."""
    s = scene.splatwright
    s.custom_steps, s.iterations = True, TRAINED_STEPS
    op("train_start", start="OVER")
    wait_for(lambda: live.backend.status.get("state") == "finished", "training", 120)
    status = live.backend.status
    wait_for(lambda: model.get("splatwright_step") == status["step"], "the object to follow the model", 30)
    return {"step": status["step"], "object_step": model["splatwright_step"], "gaussians": status["gaussians"],
            "points": len(model.data.points)}


def positions_file(obj, path: Path) -> str:
    """The positions of the points `obj` shows (as Blender evaluates it), kept for pytest."""
    np.save(path, addon().scene.native.positions(obj.evaluated_get(bpy.context.evaluated_depsgraph_get()).data))
    return str(path)


def crop(live, model, out: Path) -> dict:
    """Add Crop Box on the native object, move, turn and scale the box, delete points in Edit Mode: what the
    object shows and what Export Splats writes (cropped and not), then the box deleted."""
    bpy.context.view_layer.objects.active = model
    points = len(model.data.points)
    buttons = drawn_buttons()  # the sidebar's buttons with the object active and its model in the backend
    op("add_crop_box")
    box = bpy.context.view_layer.objects.active
    box.location = box.location + Vector(BOX_LOCATION)
    box.rotation_euler, box.scale = BOX_ROTATION, BOX_SCALE
    delete_last_points(model, DELETED)
    bpy.context.view_layer.update()
    result = {"buttons": buttons, "points": points, "deleted": DELETED, "box": box.name, "box_parent": box.parent.name, "box_size": box.empty_display_size,
              "box_matrix": [list(row) for row in box.matrix_world],
              "object_matrix": [list(row) for row in model.matrix_world],
              "modifiers": [m.name for m in model.modifiers], "evaluated_type": model.evaluated_get(
                  bpy.context.evaluated_depsgraph_get()).data.type,
              "shown": positions_file(model, out / "cropped_shown.npy"),
              "original_points": len(model.data.points)}
    export(live, model, out / "cropped.ply")
    export(live, model, out / "uncropped.ply", cropped=False)
    result["shown_after_uncropped_export"] = len(np.load(positions_file(model, out / "again.npy")))
    bpy.data.objects.remove(box)
    bpy.context.view_layer.update()
    result["shown_without_box"] = len(np.load(positions_file(model, out / "no_box.npy")))
    return result


def world_export(live, model, out: Path) -> dict:
    """The object parented under an unevenly scaled parent, turned and scaled unevenly itself (its world matrix
    shears), exported in world space."""
    parent = bpy.data.objects.new("Holder", None)
    bpy.context.scene.collection.objects.link(parent)
    parent.matrix_world = PARENT
    model.parent = parent
    model.matrix_basis = CHILD
    bpy.context.view_layer.update()
    result = {"matrix_world": [list(row) for row in model.matrix_world],
              "shown": positions_file(model, out / "affine_shown.npy")}
    export(live, model, out / "affine_world.ply", world_space=True)
    model.parent = None
    bpy.data.objects.remove(parent)
    return result


def render(scene, path: Path) -> str:
    scene.render.filepath = str(path)
    bpy.ops.render.render(write_still=True)
    return str(path)


def run(zip_path: Path, workdir: Path, session: str, out: Path, python: str) -> dict:
    scene, live, model = placed_model(zip_path, workdir, session, python)
    result = {"type": model.type, "data_type": getattr(model.data, "type", None), "points": len(model.data.points),
              "matrix_world": [list(row) for row in model.matrix_world], "ours": attributes_file(model.data,
                                                                                                out / "ours.npz")}
    export(live, model, out / "export.ply")
    model.matrix_world = PLACEMENT
    bpy.context.view_layer.update()
    result["placement"] = [list(row) for row in model.matrix_world]
    export(live, model, out / "world.spz", world_space=True)
    result["crop"] = crop(live, model, out)
    result["affine"] = world_export(live, model, out)
    model.matrix_world = PLACEMENT
    model.data.resize(KEPT)  # as deleting points in Blender would leave it
    model.data.update_tag()
    export(live, model, out / "kept.ply")
    result["exports"] = {name: str(out / name) for name in ("export.ply", "world.spz", "kept.ply", "cropped.ply",
                                                             "uncropped.ply", "affine_world.ply")}
    model.matrix_world = Matrix.Identity(4)
    bpy.ops.wm.ply_import(filepath=str(out / "export.ply"))
    imported = bpy.context.selected_objects[0]
    result["blenders"] = attributes_file(imported.data, out / "blenders.npz")
    imported.hide_render = True
    result["followed"] = follow_training(scene, live, model)
    scene.splatwright.session = ""  # final renders must not need the backend
    result["errors"] = live.backend.last_error
    stop_and_disable()  # final renders of native splats need neither the backend nor the add-on
    model.hide_render = True
    result["hidden"] = render(scene, out / "hidden.png")
    model.hide_render = False
    result["shown"] = render(scene, out / "shown.png")
    result.update(reports=blender_reports.lines)
    return result


if __name__ == "__main__":
    sys.exit(session_scenario(run))

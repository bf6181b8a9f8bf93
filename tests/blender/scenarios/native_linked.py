"""A native splat object's model kept in a file outside the .blend, in real Blender 5.3 or later (the bpy module;
test_native_linked_bpy.py runs it): install the built zip, start a CPU backend that reopens a trained session and
Add Model to Scene. Keep Outside .blend is refused while the .blend is unsaved; once it is saved, it writes the
object's model beside it and links the object to that file. The .blend is saved with the model stored and linked,
and the linked one reopened: what the object shows then is kept for pytest, Export Splats writes it, a crop box
crops it, following training leaves it out, and Store in .blend brings the model back into its cloud. A linked
file that goes missing is reported, and the object shows nothing. Import Splats with Link File shows a PLY and an
SPZ without the backend. Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/native_linked.py --zip Z --workdir SESSIONS --session NAME \
        --out DIR [--python PY]
"""
from __future__ import annotations

import sys
from pathlib import Path

import bpy
import numpy as np

from blender.kit import REPO, addon, blender_reports, drawn_buttons, op, placed_model, session_scenario, wait_for

SPZ = REPO / "tests" / "data" / "splats" / "donut3k.spz"


def shown(obj) -> dict:
    return addon().scene.native.read(obj.evaluated_get(bpy.context.evaluated_depsgraph_get()).data)


def keep(values: dict, path: Path) -> str:
    np.savez(path, **{name.replace(":", "__"): v for name, v in values.items()})
    return str(path)


def refused(name: str, **kwargs) -> str:
    """The error an operator reports (bpy raises it as RuntimeError without a window)."""
    try:
        op(name, **kwargs)
    except RuntimeError as e:
        return str(e)
    return ""


def keep_outside(model, **kwargs) -> None:
    linked = addon().scene.linked
    bpy.context.view_layer.objects.active = model
    op("keep_outside", **kwargs)
    wait_for(lambda: not linked.writing(model) and addon().scene.native.linked_path(model), "Keep Outside .blend")


def run(zip_path: Path, workdir: Path, session: str, out: Path, python: str) -> dict:
    scene, live, model = placed_model(zip_path, workdir, session, python)
    native, linked, following = addon().scene.native, addon().scene.linked, addon().scene.following
    result = {"points": len(model.data.points)}
    bpy.context.view_layer.objects.active = model
    result["unsaved_refusal"] = refused("keep_outside")
    bpy.ops.wm.save_as_mainfile(filepath=str(out / "stored.blend"))
    keep_outside(model)
    result["path"] = native.linked_path(model)
    result["file"] = linked.file_of(model)
    result["own_points"] = len(model.data.points)
    bpy.ops.wm.save_as_mainfile(filepath=str(out / "linked.blend"))
    result["sizes"] = {name: (out / f"{name}.blend").stat().st_size for name in ("stored", "linked")}

    bpy.ops.wm.open_mainfile(filepath=str(out / "linked.blend"))
    model = bpy.data.objects[session]
    bpy.context.view_layer.objects.active = model
    result["reopened"] = {"path": native.linked_path(model), "own_points": len(model.data.points),
                          "modifiers": [m.name for m in model.modifiers],
                          "evaluated_type": model.evaluated_get(bpy.context.evaluated_depsgraph_get()).data.type,
                          "shown": keep(shown(model), out / "shown.npz"),
                          "followed": model.name in [o.name for o in following.native_objects()],
                          "state": linked.state(model), "buttons": drawn_buttons()}
    op("export_splats", filepath=str(out / "export.ply"))
    wait_for(lambda: not live.backend.in_flight, "export")
    op("add_crop_box")
    box = bpy.context.view_layer.objects.active
    box.scale = (0.5, 0.5, 0.5)
    bpy.context.view_layer.update()
    result["crop"] = {"modifiers": [m.name for m in model.modifiers], "shown": len(shown(model)["position"])}
    bpy.data.objects.remove(box)

    bpy.context.view_layer.objects.active = model
    op("store_in_blend")
    result["stored"] = {"attributes": keep(native.read(model.data), out / "stored.npz"),
                        "modifiers": [m.name for m in model.modifiers],
                        "followed": model.name in [o.name for o in following.native_objects()]}

    keep_outside(model, filepath=str(out / "gone.ply"))  # an absolute path, then the file goes
    Path(linked.file_of(model)).unlink()
    wait_for(lambda: any("is missing" in line for line in blender_reports.lines), "the missing file's report", 10)
    for _ in range(3):  # more looks: reported once
        linked.watch()
    result["missing"] = {"path": native.linked_path(model), "shown": len(shown(model).get("position", ())),
                         "reports": [line for line in blender_reports.lines if "is missing" in line],
                         "store_blocked": addon().ops.splats.SPLATWRIGHT_OT_store_in_blend.blocked(bpy.context)}

    op("backend_stop")  # Link File needs no backend
    wait_for(lambda: live.backend.connection == "disconnected" and not live.backend.in_flight, "stop")
    result["link_file"] = {}
    for path in (out / f"{session}.ply", SPZ):
        op("import_splats", filepath=str(path), link_file=True)
        obj = bpy.context.view_layer.objects.active
        result["link_file"][path.name] = {"object": obj.name, "path": native.linked_path(obj),
                                          "shown": len(shown(obj)["position"]), "own_points": len(obj.data.points)}
    result["reports"] = blender_reports.lines
    result["errors"] = live.backend.last_error
    bpy.ops.preferences.addon_disable(module="splatwright")
    return result


if __name__ == "__main__":
    sys.exit(session_scenario(run))

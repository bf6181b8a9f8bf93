"""Import COLMAP, the splat formats and Send Photos in real Blender (the bpy module), with the built zip installed
as a legacy add-on: the File menus' entries, a COLMAP model imported (its cameras as the add-on converts them, its
point cloud in the world) and a distorted one refused; then, through a CPU backend run by --python, every splat
format imported and exported, bad files refused, and the COLMAP photos sent and trained a few steps. Prints
`RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/colmap.py --zip Z --out DIR --colmap FOLDER --distorted FOLDER \
        --python PY --splats tests/data/splats
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import bpy
import bmesh  # importable once bpy is

from blender.kit import RecordingLayout, addon, blender_reports, op, pump, report, wait_for

FORMATS = ("sh3.ply", "sh3.compressed.ply", "sh3.spz", "ours-sh3.splat", "sh3.ksplat", "sh3.sog", "sh3-sog/meta.json",
           "sh3.glb")  # in tests/data/splats
EXPORTS = ("out.ply", "out.compressed.ply", "out.spz", "out.splat", "out.sog", "out-sog/meta.json", "out.glb",
           "out.gltf")
PHOTO_SIDE = 64  # the photos are sent this large, and only every KEEP_POINTS-th point, so that the CPU trains
KEEP_POINTS = 8  # on them in seconds
STEPS = 40


def reports_since(start: int) -> list[str]:
    return blender_reports.lines[start:]


def menu_entries() -> dict:
    """The operators the add-on's entries in File > Import and File > Export show."""
    entries = {}
    for kind, menu in (("import", bpy.types.TOPBAR_MT_file_import), ("export", bpy.types.TOPBAR_MT_file_export)):
        shown = []
        layout = RecordingLayout([])
        layout.operator = lambda idname, **kwargs: shown.append(idname)
        for draw in menu._dyn_ui_initialize():
            if draw.__module__.startswith("splatwright"):
                draw(type("Menu", (), {"layout": layout})(), bpy.context)
        entries[kind] = shown
    return entries


def imported(empty) -> dict:
    """What came in: each camera as the add-on converts it, and the points where they are in the world."""
    scene, core = bpy.context.scene, addon().core
    bpy.context.view_layer.update()
    cameras = {}
    for obj in empty.children:
        if obj.type == "CAMERA":
            background = obj.data.background_images[0].image if obj.data.background_images else None
            cameras[obj["splatwright_photo"]] = {
                "camera": core.codecs.camera_to_wire(addon().scene.reading.camera_of(obj, scene)),
                "split": obj["splatwright_split"], "photo": background.filepath if background else "",
                "shows_photo": obj.data.show_background_images}
    xyz, rgb = addon().scene.colmap.world_points(empty)
    return {"empty": empty.name, "matrix": [list(row) for row in empty.matrix_world], "cameras": cameras,
            "points": xyz.tolist(), "colors": rgb.tolist(), "objects": len(empty.children),
            "render": [scene.render.resolution_x, scene.render.resolution_y, scene.render.pixel_aspect_x,
                       scene.render.pixel_aspect_y], "scene_camera": scene.camera.name if scene.camera else ""}


def import_colmap(folder: Path, **options) -> tuple[list[str], str]:
    """Run Import COLMAP; what it returned and its report (an error report raises in the bpy module)."""
    start = len(blender_reports.lines)
    try:
        returned = list(bpy.ops.splatwright.import_colmap(directory=str(folder), **options))
    except RuntimeError as e:
        return ["CANCELLED"], str(e)
    return returned, " ".join(reports_since(start))


def formats(live, splats: Path, out: Path) -> dict:
    """Import each format, export the SH 3 model in each, and refuse bad files, each in one report line."""
    result = {"loaded": {}, "exported": {}}
    op("import_splats", filepath=str(splats / "sh3.niantic-v4.spz"), spz_axes="rub")  # RUB, not saying so
    wait_for(lambda: not live.backend.in_flight, "import sh3.niantic-v4.spz")
    op("export_splats", filepath=str(out / "niantic-rub.ply"))
    wait_for(lambda: not live.backend.in_flight, "export niantic-rub.ply")
    result["spz_axes"] = {"path": str(out / "niantic-rub.ply"), "error": live.backend.last_error}
    for name in FORMATS:
        op("import_splats", filepath=str(splats / name))
        wait_for(lambda: not live.backend.in_flight, f"import {name}")
        result["loaded"][name] = {"gaussians": live.backend.status.get("gaussians"), "error": live.backend.last_error}
    op("import_splats", filepath=str(splats / "sh3.ply"))
    wait_for(lambda: not live.backend.in_flight, "import sh3.ply")
    a = addon()
    if not a.scene.native.available():  # where Blender draws splats the import placed it already
        op("add_model")  # an imported file's session is placed in the scene as a trained one is
        wait_for(lambda: not live.backend.in_flight, "add the imported model to the scene")
    session, placed = live.backend.status.get("session"), a.scene.splats.splat_objects(bpy.context.scene)
    result["placed"] = {"session": session, "error": live.backend.last_error,
                        "objects": [o.name for o in placed if o[a.scene.splats.SESSION_KEY] == session],
                        "types": sorted({o.type for o in placed})}
    for name in EXPORTS:
        start = len(blender_reports.lines)
        op("export_splats", filepath=str(out / name))
        wait_for(lambda: not live.backend.in_flight, f"export {name}")
        result["exported"][name] = {"path": str(out / name), "reports": reports_since(start)}
    (out / "bad.spz").write_text("not a splat file\n")
    for what, name, bad, good in (("bad_import", "import_splats", out / "bad.spz", splats / "sh3.ply"),
                                  ("bad_export", "export_splats", out / "model.obj", out / "again.ply")):
        start = len(blender_reports.lines)
        op(name, filepath=str(bad))
        wait_for(lambda: not live.backend.in_flight, what)
        result[what] = reports_since(start)
        op(name, filepath=str(good))  # what failed works again: its error is cleared
        wait_for(lambda: not live.backend.in_flight, f"{name} again")
    result["errors_after"] = live.backend.last_error
    return result


def photos(live, empty, out: Path) -> dict:
    """Thin the point cloud, send the photos at PHOTO_SIDE pixels, train one step and export the model, then train
    STEPS from the same start and export that."""
    scene = bpy.context.scene
    s = scene.splatwright
    s.max_side, s.custom_steps, s.sh_degree, s.background = PHOTO_SIDE, True, 0, "BLACK"
    cloud = next(o for o in empty.children if o.type == "MESH")
    edit = bmesh.new()  # the point cloud is sent as it is in the scene: thinned here as a user might
    edit.from_mesh(cloud.data)
    bmesh.ops.delete(edit, geom=[v for i, v in enumerate(edit.verts) if i % KEEP_POINTS], context="VERTS")
    edit.to_mesh(cloud.data)
    edit.free()
    start = len(blender_reports.lines)
    began = time.perf_counter()
    s.source = "PHOTOS"  # Send to Backend sends the selected import's photos
    op("send_views")
    wait_for(lambda: not live.backend.in_flight, "send photos")
    result = {"sent": reports_since(start), "status": dict(live.backend.status), "session": s.session,
              "send_seconds": time.perf_counter() - began, "points": addon().scene.colmap.world_points(empty)[0].tolist()}
    for steps, name in ((1, "first_step.ply"), (STEPS, "trained.ply")):
        s.iterations = steps
        op("train_start", start="OVER")  # the second time from the same start (its seed) again
        wait_for(lambda: live.backend.status.get("state") == "finished" and live.backend.status.get("step") == steps
                 and not live.backend.in_flight, f"training to step {steps}", 240)
        op("export_splats", filepath=str(out / name))
        wait_for(lambda: not live.backend.in_flight, f"export {name}")
        result[name] = str(out / name)
    result["final_status"], result["errors"] = dict(live.backend.status), live.backend.last_error
    return result


def run(zip_path: Path, out: Path, colmap: Path, distorted: Path, python: str, splats: Path) -> dict:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    result = {"menus": menu_entries(), "seconds": {}}
    began = time.perf_counter()

    def lap(what: str) -> None:
        nonlocal began
        result["seconds"][what], began = time.perf_counter() - began, time.perf_counter()
    result["distorted"] = import_colmap(distorted) + (len(bpy.context.scene.objects),)
    result["import"] = import_colmap(colmap / "sparse", up_axis="CAMERAS", centre=True, scale=2.0)
    empty = bpy.context.view_layer.objects.active
    lap("import")
    result["model"] = imported(empty)
    bpy.context.scene.splatwright.source = "PHOTOS"  # the main panel shows the import it takes photos from
    result["drawn"] = [t for t in draw_panels() if "photos" in t or t.startswith("COLMAP")]
    bpy.context.scene.splatwright.source = "ORBIT"
    lap("cameras")
    live = addon().scene.live
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = python, str(out / "sessions")
    op("backend_start")
    wait_for(lambda: live.backend.connection == "connected", "backend start", 120)
    lap("backend_start")
    result["formats"] = formats(live, splats, out)
    lap("formats")
    bpy.context.view_layer.objects.active = empty.children[0]  # Send Photos finds the import from a child
    result["photos"] = photos(live, empty, out)
    lap("photos")
    op("backend_stop")
    wait_for(lambda: live.backend.connection == "disconnected" and not live.backend.in_flight, "stop")
    pump()
    bpy.ops.preferences.addon_disable(module="splatwright")
    result["menus_after_disable"] = menu_entries()
    return result


def draw_panels() -> list[str]:
    texts: list[str] = []
    for panel in addon().ui.panels.CLASSES:
        panel.draw(type("Panel", (), {"layout": RecordingLayout(texts)})(), bpy.context)
    return texts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--colmap", required=True, help="a COLMAP capture folder with images/ and sparse/")
    parser.add_argument("--distorted", required=True, help="a COLMAP model folder with a distorted camera model")
    parser.add_argument("--python", required=True, help="the backend's Python (with torch)")
    parser.add_argument("--splats", required=True, help="tests/data/splats")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: run(Path(args.zip), out, Path(args.colmap), Path(args.distorted), args.python,
                              Path(args.splats)))


if __name__ == "__main__":
    sys.exit(main())

"""Native splats, in real Blender 5.3 or later (the bpy module; test_native_bpy.py runs it): install the built
zip, start a CPU backend that reopens a trained session, Add Model to Scene, which makes Blender's own splat
object of the model; the object's attributes are kept for pytest beside those Blender's own PLY importer makes
of the backend's export of the same model, and the scene is rendered with Cycles with the object hidden and
shown (no compositor set-up, no backend in the render). Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/native.py --zip Z --workdir SESSIONS --session NAME --out DIR \
        [--python PY]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import bpy
import numpy as np

from blender.kit import addon, blender_reports, op, placed_model, report, stop_and_disable, wait_for


def attributes_file(cloud, path: Path) -> str:
    np.savez(path, **{name.replace(":", "__"): values for name, values in addon().scene.native.read(cloud).items()})
    return str(path)


def render(scene, path: Path) -> str:
    scene.render.filepath = str(path)
    bpy.ops.render.render(write_still=True)
    return str(path)


def run(zip_path: Path, workdir: Path, session: str, out: Path, python: str) -> dict:
    scene, live, model = placed_model(zip_path, workdir, session, python)
    result = {"type": model.type, "data_type": getattr(model.data, "type", None), "points": len(model.data.points),
              "matrix_world": [list(row) for row in model.matrix_world], "ours": attributes_file(model.data,
                                                                                                out / "ours.npz")}
    op("export_splats", filepath=str(out / "export.ply"))
    wait_for(lambda: not live.backend.in_flight, "export the model")
    bpy.ops.wm.ply_import(filepath=str(out / "export.ply"))
    imported = bpy.context.selected_objects[0]
    result["blenders"] = attributes_file(imported.data, out / "blenders.npz")
    imported.hide_render = True
    scene.splatwright.session = ""  # final renders must not need the backend
    live.backend.stop()
    wait_for(lambda: live.backend.connection != "connected", "backend stop")
    model.hide_render = True
    result["hidden"] = render(scene, out / "hidden.png")
    model.hide_render = False
    result["shown"] = render(scene, out / "shown.png")
    result.update(reports=blender_reports.lines, errors=live.backend.last_error)
    stop_and_disable()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default=sys.executable, help="the backend's Python, with torch")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: run(Path(args.zip), Path(args.workdir), args.session, out, args.python))


if __name__ == "__main__":
    sys.exit(main())

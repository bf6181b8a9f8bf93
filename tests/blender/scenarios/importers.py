"""Blender's own importers on splat files (no add-on): each file given is imported with bpy.ops.wm.ply_import or
bpy.ops.wm.spz_import, and the cloud's attributes are saved for tests/test_importers_bpy.py.

    PYTHONPATH=tests python tests/blender/scenarios/importers.py --out DIR FILE...
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import bpy
import numpy as np

from blender.kit import report

ATTRIBUTES = {"position": ("vector", 3), "scale": ("vector", 3), "rotation": ("value", 4), "radiance:base": ("vector", 4)}


def imported(path: Path, out: Path) -> dict:
    before = set(bpy.data.objects)
    importer = bpy.ops.wm.spz_import if path.suffix == ".spz" else bpy.ops.wm.ply_import
    assert importer(filepath=str(path)) == {"FINISHED"}, path
    [obj] = [o for o in bpy.data.objects if o not in before]
    cloud = obj.data
    saved = {}
    for name, (field, width) in ATTRIBUTES.items():
        values = np.zeros(len(cloud.points) * width, np.float32)
        cloud.attributes[name].data.foreach_get(field, values)
        saved[name.replace(":", "__")] = values.reshape(-1, width)
    np.savez(out / f"{path.name}.npz", **saved)
    return {"type": obj.type, "points": len(cloud.points), "matrix": [list(row) for row in obj.matrix_world],
            "attributes": str(out / f"{path.name}.npz")}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bpy.ops.wm.read_factory_settings(use_empty=True)
    return report(lambda: {"version": bpy.app.version_string,
                           **{Path(f).name: imported(Path(f), out) for f in args.files}})


if __name__ == "__main__":
    sys.exit(main())

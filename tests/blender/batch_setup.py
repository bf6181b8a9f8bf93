"""Prepares a command-line animation render (`blender -b scene.blend -a`) with the Splatwright engine, in
Debian's Blender 3.4 (run by test_addon_bpy.py): installs and enables the built add-on, points its preferences
at this checkout's backend and a folder of sessions and saves them, then saves a scene that renders two frames
of its camera with the Splatwright engine from the given session, and a copy of it under Filmic. Writes
setup.json (the camera) beside them.

    blender -b --python tests/blender/batch_setup.py -- --zip Z --python PY --workdir W --session S --out DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import bpy

SIZE = (64, 48)


def main() -> None:
    argv = sys.argv[sys.argv.index("--") + 1:]
    args = {argv[i].lstrip("-"): argv[i + 1] for i in range(0, len(argv), 2)}
    out = Path(args["out"])
    bpy.ops.preferences.addon_install(filepath=args["zip"], overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = args["python"], args["workdir"]
    bpy.ops.wm.save_userpref()

    scene = bpy.context.scene
    render = scene.render
    render.engine = "SPLATWRIGHT"
    render.resolution_x, render.resolution_y, render.resolution_percentage = *SIZE, 100
    render.image_settings.file_format, render.image_settings.color_mode = "PNG", "RGBA"
    render.filepath = str(out / "frame_")
    scene.view_settings.view_transform = "Standard"
    scene.frame_start, scene.frame_end = 1, 2
    scene.splatwright.session = args["session"]
    addon = sys.modules["splatwright"]
    cam = addon.scene.reading.camera_of(scene.camera, scene)
    (out / "setup.json").write_text(json.dumps(addon.core.codecs.camera_to_wire(cam)))
    bpy.ops.wm.save_as_mainfile(filepath=str(out / "scene.blend"))
    # The same under Filmic, Blender 3.4's default, whose render builds the view transform's inverse.
    scene.view_settings.view_transform = "Filmic"
    render.filepath = str(out / "filmic_")
    bpy.ops.wm.save_as_mainfile(filepath=str(out / "scene_filmic.blend"))


main()

"""File > Import and File > Export of splat models in every format the backend reads and writes (the official
3DGS PLY, PlayCanvas's compressed PLY, Niantic's SPZ and antimatter15's .splat; backend/formats). Import sends
the file to the backend, which tells its format from its content and shows the model; Export asks the backend
for the shown model in the format the file name's ending picks (*.ply, *.compressed.ply, *.spz, *.splat) and
reports what that format leaves out (a .splat keeps no SH beyond degree 0)."""
from __future__ import annotations

from pathlib import Path

import bpy
from bpy.props import StringProperty
from bpy.types import Operator
from bpy_extras.io_utils import ExportHelper, ImportHelper

from . import live
from .core.files import write_atomic
from .operators import Guarded, nothing_to_show, not_connected, set_status, training_runs
from .training import background_rgb

SPLAT_FILES = "*.ply;*.spz;*.splat"  # what the file browsers list (a compressed PLY ends in .ply too)
DEFAULT_EXTENSION = ".ply"  # given to an export name that has none
MENU_TEXT = "Gaussian Splats (.ply, .spz, .splat)"


class SPLATWRIGHT_OT_import_splats(Guarded, Operator, ImportHelper):
    """View a Gaussian splat file through the backend: a 3DGS PLY, a compressed PLY, an SPZ or a .splat"""
    bl_idname = "splatwright.import_splats"
    bl_label = "Import Splats"

    filter_glob: StringProperty(default=SPLAT_FILES, options={"HIDDEN"})

    @classmethod
    def blocked(cls, context):
        return not_connected() or training_runs()

    def execute(self, context):
        path = Path(self.filepath)
        if not path.is_file():
            self.report({"ERROR"}, f"{path}: no such file; choose a .ply, .spz or .splat file")
            return {"CANCELLED"}
        s = context.scene.splatwright
        background = background_rgb(s.background, s.background_color)

        def load(client):  # on the worker: the file may be large
            reply = client.load_ply(path.read_bytes(), background, path.name)
            return reply, client.call("status")

        def loaded(result) -> str:
            reply, status = result
            set_status(status)
            return f"loaded {reply['gaussians']} Gaussians (SH degree {reply['sh_degree']}) from {path}"
        live.backend.call("import_splats", load, loaded)
        return {"FINISHED"}


class SPLATWRIGHT_OT_export_splats(Guarded, Operator, ExportHelper):
    """Save the trained (or viewed) Gaussians in the format the file name's ending gives: .ply (3DGS PLY),
    .compressed.ply (PlayCanvas), .spz (Niantic) or .splat (antimatter15, no view-dependent colour)"""
    bl_idname = "splatwright.export_splats"
    bl_label = "Export Splats"

    filename_ext = DEFAULT_EXTENSION
    check_extension = None  # the ending typed picks the format: leave it as it is
    filter_glob: StringProperty(default=SPLAT_FILES, options={"HIDDEN"})

    @classmethod
    def blocked(cls, context):
        return nothing_to_show()

    def execute(self, context):
        path = Path(self.filepath)
        if not path.suffix:
            path = path.with_name(path.name + DEFAULT_EXTENSION)

        def export(client):
            reply = client.request("export_ply", {"name": path.name})
            write_atomic(path, reply.payload)
            return reply.fields

        def exported(fields) -> str:
            if fields["note"]:
                live.report("WARNING", f"{path.name}: {fields['note']}")
            return f"exported {fields['gaussians']} Gaussians (step {fields['step']}) to {path} ({fields['format']})"
        live.backend.call("export_splats", export, exported)
        return {"FINISHED"}


def import_menu(self, context):
    self.layout.operator(SPLATWRIGHT_OT_import_splats.bl_idname, text=MENU_TEXT)


def export_menu(self, context):
    self.layout.operator(SPLATWRIGHT_OT_export_splats.bl_idname, text=MENU_TEXT)


CLASSES = (SPLATWRIGHT_OT_import_splats, SPLATWRIGHT_OT_export_splats)
_register_classes, _unregister_classes = bpy.utils.register_classes_factory(CLASSES)


def register():
    _register_classes()
    bpy.types.TOPBAR_MT_file_import.append(import_menu)
    bpy.types.TOPBAR_MT_file_export.append(export_menu)


def unregister():
    bpy.types.TOPBAR_MT_file_export.remove(export_menu)
    bpy.types.TOPBAR_MT_file_import.remove(import_menu)
    _unregister_classes()

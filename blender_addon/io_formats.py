"""File > Import and File > Export of splat models in every format the backend reads and writes (the official
3DGS PLY, PlayCanvas's compressed PLY, Niantic's SPZ and antimatter15's .splat; backend/formats). Import sends
the file to the backend, which tells its format from its content and shows the model; Export asks the backend
for a model in the format the file name's ending picks (*.ply, *.compressed.ply, *.spz, *.splat) and reports
what that format leaves out (a .splat keeps no SH beyond degree 0). The model is the active splat object's
(scene_splats.py), cropped to its crop box unless told otherwise and, if asked, in world space as the object
places it; with no splat object active, the model the backend shows."""
from __future__ import annotations

from pathlib import Path

import bpy
from bpy.props import BoolProperty, StringProperty
from bpy.types import Operator
from bpy_extras.io_utils import ExportHelper, ImportHelper

from . import live, scene_splats  # which imports this module (through panels): its names are looked up when used
from .core.errors import SplatwrightError
from .core.files import write_atomic
from .operators import Guarded, nothing_to_show, not_connected, set_status, training_runs
from .placement import uniform_scale
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
    """Save the active splat object's model (or else the trained or viewed Gaussians) in the format the file
    name's ending gives: .ply (3DGS PLY), .compressed.ply (PlayCanvas), .spz (Niantic) or .splat (antimatter15,
    no view-dependent colour)"""
    bl_idname = "splatwright.export_splats"
    bl_label = "Export Splats"

    filename_ext = DEFAULT_EXTENSION
    check_extension = None  # the ending typed picks the format: leave it as it is
    filter_glob: StringProperty(default=SPLAT_FILES, options={"HIDDEN"})
    cropped: BoolProperty(name="Cropped", default=True,
                          description="Only the splats inside the active splat object's crop box")
    world_space: BoolProperty(name="In World Space", default=False,
                              description="The model as the active splat object places it in the scene: its "
                                          "means, rotations, scales and view-dependent colours moved by the "
                                          "object's transform")

    @classmethod
    def blocked(cls, context):
        return not_connected() if scene_splats.active_model(context) is not None else nothing_to_show()

    def draw(self, context):
        obj, layout = scene_splats.active_model(context), self.layout
        layout.label(text=f"Model of {obj.name}" if obj is not None else "The model the backend shows")
        for name, usable in (("cropped", obj is not None and scene_splats.crop_box(obj) is not None),
                             ("world_space", obj is not None)):
            row = layout.row()
            row.enabled = usable
            row.prop(self, name)

    def request_fields(self, context, name: str) -> dict:
        """The export_ply request's fields: the active splat object's model as the options say, or the shown
        model; SplatwrightError for a placement splats cannot take."""
        obj = scene_splats.active_model(context)
        if obj is None:
            return {"name": name}
        fields = {"name": name, **scene_splats.model_choice(obj, context.scene, self.cropped)}
        if self.world_space:
            fields["placement"] = scene_splats.model_matrix(obj)
            uniform_scale(fields["placement"], obj.name)
        return fields

    def execute(self, context):
        path = Path(self.filepath)
        if not path.suffix:
            path = path.with_name(path.name + DEFAULT_EXTENSION)
        try:
            fields = self.request_fields(context, path.name)
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}

        def export(client):
            reply = client.request("export_ply", fields)
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

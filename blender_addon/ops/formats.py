"""File > Import and File > Export of splat models in every format the backend reads and writes (the official 3DGS PLY,
PlayCanvas's compressed PLY and SOG, Niantic's SPZ, antimatter15's .splat, glTF's KHR_gaussian_splatting and, for
import, mkkellogg's .ksplat; backend/formats) and of 4D models (splats4d.pt, backend/dynamic.py). Import sends the
file to the backend (a SOG folder's meta.json as the bundled .sog, a .gltf with its buffers inline: core/bundles.py),
which tells its format from its content (an SPZ that does not say its axes read in those SPZ Axes names), keeps the
file in a new session named after it and shows the model (a 4D one at the scene's frame); Add Model to Scene then
places it in the scene as it does a trained model, and the .blend keeps it; on Blender 5.3 and later Link File
instead makes an object that shows the file itself, kept outside the .blend (scene/linked.py), with no backend.
Export asks the backend for a model in the format the file name's ending picks (*.ply, *.compressed.ply, *.spz,
*.splat, *.sog, *.glb, *.gltf, or a folder's meta.json for a SOG of files side by side; *.pt: a 4D model's own file)
and reports what that format leaves out (a .splat keeps no SH beyond degree 0). The model is the active splat
object's (scene/splats.py), cropped to its crop box unless told otherwise and, if asked, in world space as the object
places it; with no splat object active, the model the backend shows. A 4D model is exported at the scene's frame, or
as a sequence of files, one per frame of the frame range (SequenceExport)."""
from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import bpy
from bpy.props import BoolProperty, EnumProperty, StringProperty
from bpy.types import Operator
from bpy_extras.io_utils import ExportHelper, ImportHelper

from ..core.bundles import bundled, is_sog_meta, write_sog_folder
from ..core.client import RemoteError
from ..core.errors import SplatwrightError
from ..core.files import (TEMPORARY_SUFFIX, begin_sequence, end_sequence, sequence_paths, sequence_state, sync_folder,
                          write_atomic)
from ..core.settings import SPZ_AXES
from ..core.splats import encode_ply_bytes
from ..logic.dataset import frame_time
from ..logic.messages import at_step
from ..logic.native import file_import_node, from_attributes
from ..logic.placement import any_affine, uniform_scale
from ..logic.training import background_rgb
from ..scene import linked, live, native, splats
from ..scene.session import capture_runs, nothing_to_show, not_connected, set_status, training_runs
from .base import Guarded, add_model_to_scene

SPLAT_FILES = "*.ply;*.spz;*.splat;*.ksplat;*.sog;*meta.json;*.glb;*.gltf;*.pt"  # what the file browsers list (a
# compressed PLY ends in .ply too; a SOG folder is its meta.json)
DYNAMIC_SUFFIX = ".pt"  # a 4D model's own file (splats4d.pt)
DEFAULT_EXTENSION = ".ply"  # given to an export name that has none
MENU_TEXT = "Gaussian Splats (.ply, .spz, .splat, .ksplat, .sog, .glb, .gltf, .pt)"
SPZ_AXES_ITEMS = tuple(zip(SPZ_AXES, ("PLY's (SuperSplat)", "RUB (Niantic)"), (
    "As SuperSplat and splat-transform store them: the PLY's axes, unconverted",
    "As the SPZ specification says, and Niantic's tools and Splatwright's version 3 store them")))
PROGRESS_SECONDS = 1.0  # how often a sequence export reports how far it got
_progress_timers: set = set()  # those of sequence exports, unregistered with the add-on if they still are


class SPLATWRIGHT_OT_import_splats(Guarded, Operator, ImportHelper):
    """Show a Gaussian splat file through the backend: a 3DGS PLY, a compressed PLY, an SPZ, a .splat, a .ksplat, a
    SOG (a .sog, or a folder's meta.json), a glTF (.glb, .gltf), or a 4D model (splats4d.pt), shown at the scene's
    frame. The backend keeps it in a session of its own, which Add Model to Scene places in the scene (where Blender
    draws splats itself, the import adds it at once; or with Link File, an object that shows the PLY or SPZ file as
    it is, kept outside the .blend, without the backend)"""
    bl_idname = "splatwright.import_splats"
    bl_label = "Import Splats"

    filter_glob: StringProperty(default=SPLAT_FILES, options={"HIDDEN"})
    link_file: BoolProperty(name="Link File", default=False,
                            description="Show the file as it is (a 3DGS PLY or an SPZ), kept outside the .blend, "
                                        "which keeps only its path: no copy, no backend, and no session to follow")
    spz_axes: EnumProperty(name="SPZ Axes", items=SPZ_AXES_ITEMS, default=SPZ_AXES[0],
                           description="The axes of an SPZ file that does not say its own (Splatwright's version 4 "
                                       "files say theirs, which wins); Link File shows an SPZ as Blender reads it")

    @classmethod
    def blocked(cls, context):
        return "" if native.available() else cls.backend_blocked()

    @staticmethod
    def backend_blocked() -> str:
        return not_connected() or training_runs() or capture_runs()

    def draw(self, context):
        if native.available():
            self.layout.prop(self, "link_file")
        self.layout.prop(self, "spz_axes")

    def execute(self, context):
        path = Path(self.filepath)
        if not path.is_file():
            what = "a folder" if path.is_dir() else "no such file"
            self.report({"ERROR"}, f"{path}: {what}; choose a .ply, .spz, .splat, .ksplat, .sog, meta.json, .glb, "
                                   ".gltf or .pt file")
            return {"CANCELLED"}
        if self.link_file and native.available():
            return self.link(context, path)
        if reason := self.backend_blocked():
            also = " (or tick Link File to show a .ply or .spz without it)" if native.available() else ""
            self.report({"ERROR"}, f"{reason}{also}")
            return {"CANCELLED"}
        sequence = sequence_state(path)
        if sequence is not None and not sequence.complete:
            self.report({"WARNING"}, sequence.message)
        s = context.scene.splatwright
        background = background_rgb(s.background, s.background_color)
        spz_axes = self.spz_axes  # the operator is gone by the time the worker runs

        def load(client):  # on the worker: the file may be large
            data, name = bundled(path)  # a SOG folder, a .gltf's buffers: one file
            reply = client.load_ply(data, background, name, spz_axes)
            return reply, client.call("status")

        def loaded(result) -> str:
            reply, status = result
            set_status(status)
            if not s.session:  # a scene of its own: the backend reopens it there after a restart
                s.session = reply["session"]
            what = " of a 4D model, shown at the scene's frame," if status["dynamic"] else ""
            done = (f"loaded {reply['gaussians']} Gaussians (SH degree {reply['sh_degree']}){what} from {path} "
                    f"into session {reply['session']}")
            if not native.available():
                return f"{done}; Add Model to Scene places it in the scene"
            add_model_to_scene(bpy.context, reply["session"], f"{done}; ")  # Blender draws it: an object at once
            return ""
        live.backend.call("import_splats", load, loaded)
        return {"FINISHED"}

    def link(self, context, path: Path) -> set:
        """An object that shows file `path` through Blender's own import node (splats.add_linked_object)."""
        try:
            file_import_node(path.name)
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        stored = linked.stored_path(os.path.normpath(str(path.resolve())))
        obj = splats.add_linked_object(context.view_layer, context.collection, path.name.split(".")[0], stored)
        count = len(obj.evaluated_get(context.evaluated_depsgraph_get()).data.points)
        if not count:
            why = native.file_warning(obj) or "no splats in it"
            bpy.data.objects.remove(obj)
            self.report({"ERROR"}, f"Blender cannot show {path} ({why}); link a 3DGS PLY or an SPZ file")
            return {"CANCELLED"}
        self.report({"INFO"}, f"added {obj.name}, {count:,} splats of {stored}, kept outside the .blend, which keeps "
                              "only the path")
        return {"FINISHED"}


class SPLATWRIGHT_OT_export_splats(Guarded, Operator, ExportHelper):
    """Save the active splat object's model (or else the trained or viewed Gaussians) in the format the file
    name's ending gives: .ply (3DGS PLY), .compressed.ply (PlayCanvas), .spz (Niantic), .splat (antimatter15,
    no view-dependent colour), .sog or meta.json (PlayCanvas SOG, bundled or a folder), .glb or .gltf (glTF) or
    .pt (a 4D model's own file); a 4D model at the scene's frame, or as a PLY sequence"""
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
    sequence: BoolProperty(name="PLY Sequence", default=False,
                           description="A 4D model as one file per frame of the scene's frame range, each the "
                                       "model at that frame's time: name_0001.ply, name_0002.ply ... (in the "
                                       "format the name's ending gives), written whole or not at all")

    @classmethod
    def blocked(cls, context):
        return not_connected() if splats.active_model(context) is not None else nothing_to_show()

    def draw(self, context):
        obj, layout = splats.active_model(context), self.layout
        layout.label(text=f"Model of {obj.name}" if obj is not None else "The model the backend shows")
        for name, usable in (("cropped", obj is not None and splats.crop_box(obj) is not None),
                             ("world_space", obj is not None), ("sequence", may_move(obj))):
            row = layout.row()
            row.enabled = usable
            row.prop(self, name)

    def request_fields(self, context, name: str) -> dict:
        """The export_ply request's fields: the active splat object's model as the options say, or the shown
        model, at the scene's frame; SplatwrightError for a placement splats cannot take."""
        obj = splats.active_model(context)
        if obj is None:
            return {"name": name, "time": splats.scene_time(context.scene)}
        fields = {"name": name, **splats.model_choice(obj, context.scene, self.cropped)}
        if self.world_space:
            fields["placement"] = splats.model_matrix(obj)
            uniform_scale(fields["placement"], obj.name)
        return fields

    def execute(self, context):
        path = Path(self.filepath)
        if not path.suffix:
            path = path.with_name(path.name + DEFAULT_EXTENSION)
        obj = splats.active_model(context)
        if obj is not None and obj.type == "POINTCLOUD":
            return self.export_native(context, obj, path)
        try:
            fields = self.request_fields(context, path.name)
            if self.sequence and may_move(obj):
                SequenceExport(context.scene, path, fields, obj.name if obj is not None else "").start()
                return {"FINISHED"}
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}

        return write_file(path, "export_ply", fields, lambda: b"",
                          lambda reply: f"{reply['gaussians']} Gaussians{at_step(reply['step'])}")

    def export_native(self, context, obj, path: Path) -> set:
        """Save what native splat object `obj` shows (as Blender evaluates it: edits, its crop box and other
        modifiers included), in the format the name gives, by the backend, which encodes every format; in world
        space, placed by its world matrix whatever it is (backend/placement.py's convention)."""
        placement = None
        if self.world_space:  # any affine: moved, unevenly scaled, sheared, mirrored, parented
            try:
                placement = any_affine(splats.model_matrix(obj), obj.name)
            except SplatwrightError as e:
                self.report({"ERROR"}, str(e))
                return {"CANCELLED"}
        shown = from_attributes(native.shown_attributes(context, obj, self.cropped))
        return write_file(path, "convert_model", {"name": path.name, "placement": placement},
                          lambda: encode_ply_bytes(shown),
                          lambda reply: f"the {reply['gaussians']} Gaussians {obj.name} shows")


def write_file(path: Path, request: str, fields: dict, payload, what) -> set:
    """Have the backend make the file (`request` with `fields` and the bytes `payload()` makes, on the worker)
    and write it to `path` whole; the report names `what(reply's fields)` and what the format left out."""
    def export(client):
        reply = client.request(request, fields, payload())
        if is_sog_meta(path):  # the bundled SOG the backend made, as a folder
            write_sog_folder(path, reply.payload)
        else:
            write_atomic(path, reply.payload)
        return reply.fields

    def exported(reply: dict) -> str:
        if reply["note"]:
            live.report("WARNING", f"{path.name}: {reply['note']}")
        return f"exported {what(reply)} to {path} ({reply['format']})"
    live.backend.call("export_splats", export, exported)
    return {"FINISHED"}


def may_move(obj) -> bool:
    """Whether the model exported may be 4D: the backend's status tells of the model it shows; a splat object's
    (`obj`) only the backend knows, and says so when a sequence of a static model is asked for; a native splat
    object holds one time of it."""
    return (obj is not None and obj.type == "EMPTY") or (obj is None and bool(live.backend.status.get("dynamic")))


class SequenceExport:
    """A 4D model as files, one per frame of the scene's frame range, each the model at that frame's time
    (dataset.frame_time), exported on the worker; a timer reports how far it got. Each frame goes to a
    temporary file beside its own, and once every frame is written they replace their files together; a failure
    removes them and names the frame, so a sequence is written whole or not at all. The sequence's manifest
    (files.begin_sequence) says it is incomplete while its frames are put in place, so a Blender that dies then
    leaves a sequence known as incomplete."""

    def __init__(self, scene, path: Path, fields: dict, obj_name: str = ""):
        if path.name.lower().endswith(DYNAMIC_SUFFIX):
            raise SplatwrightError(f"{path.name}: a PLY sequence is one splat file per frame; name it .ply (or "
                                   ".compressed.ply, .spz, .splat)")
        start, end = scene.frame_start, scene.frame_end
        self.frames = list(range(start, end + 1))
        self.times = [frame_time(frame, start, end) for frame in self.frames]
        self.path, self.paths = path, sequence_paths(path, len(self.frames))
        self.fields, self.what = fields, f"the model of {obj_name}" if obj_name else "the model the backend shows"
        self.written = 0  # frames written so far (by the worker)
        self.done = threading.Event()

    def start(self) -> None:
        reported = [0]

        def progress():  # a timer on the main thread, until the worker is done
            if self.done.is_set():
                return None
            if self.written > reported[0]:
                reported[0] = self.written
                live.report("INFO", f"exporting {self.paths[0].name} ...: {self.written} of {len(self.paths)} frames")
            return PROGRESS_SECONDS
        _progress_timers.difference_update([t for t in _progress_timers if not bpy.app.timers.is_registered(t)])
        _progress_timers.add(progress)
        bpy.app.timers.register(progress, first_interval=PROGRESS_SECONDS)
        live.backend.call("export_sequence", self.run, self.finished)

    def run(self, client) -> dict:
        """On the worker: every frame, staged, then put in place; the last frame's reply fields."""
        staged: list[Path] = []
        try:
            for frame, time, path in zip(self.frames, self.times, self.paths):
                try:
                    reply = client.request("export_ply", {**self.fields, "name": path.name, "time": time})
                except (RemoteError, SplatwrightError, OSError, ValueError) as e:
                    raise self.failure(frame, path, e) from None
                if not reply.fields["dynamic"]:
                    raise SplatwrightError(f"{self.what} is a static model, the same at every frame: a PLY sequence "
                                           "needs a 4D model (splats4d.pt, or a session trained on views with "
                                           "times); untick PLY Sequence to export one file")
                try:
                    staged.append(stage(path, reply.payload))
                except OSError as e:
                    raise self.failure(frame, path, e) from None
                self.written += 1
            begin_sequence(self.path, self.paths)  # a Blender that dies now leaves it marked incomplete
            for tmp, path in zip(staged, self.paths):
                os.replace(tmp, path)
            sync_folder(self.paths[0].parent)
            end_sequence(self.path, self.paths)
            return reply.fields
        finally:
            for tmp in staged:
                tmp.unlink(missing_ok=True)  # those not put in place
            self.done.set()

    def failure(self, frame: int, path: Path, e: Exception) -> SplatwrightError:
        reason = e.message if isinstance(e, RemoteError) else str(e) if isinstance(e, SplatwrightError) \
            else f"{type(e).__name__}: {e}"
        return SplatwrightError(f"frame {frame} ({path.name}) failed: {reason}; no file of the sequence was written")

    def finished(self, fields: dict) -> str:
        if fields["note"]:
            live.report("WARNING", f"{self.paths[0].name} ...: {fields['note']}")
        first, last = self.paths[0], self.paths[-1]
        return (f"exported {len(self.paths)} frames ({self.frames[0]}-{self.frames[-1]}) of {fields['gaussians']} "
                f"Gaussians to {first.parent}: {first.name} ... {last.name} ({fields['format']})")


def stage(path: Path, data: bytes | memoryview) -> Path:
    """`data` in a new temporary file beside `path`, on the disk; its name."""
    fd, name = tempfile.mkstemp(prefix=path.name + ".", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


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
    for timer in _progress_timers:
        if bpy.app.timers.is_registered(timer):
            bpy.app.timers.unregister(timer)
    _progress_timers.clear()
    bpy.types.TOPBAR_MT_file_export.remove(export_menu)
    bpy.types.TOPBAR_MT_file_import.remove(import_menu)
    _unregister_classes()

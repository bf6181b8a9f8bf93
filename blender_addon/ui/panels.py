"""The 'Splats' tab of the 3D viewport's sidebar: one main panel that reads top to bottom as the work goes (where
the splats come from, the one button for the next step, the live state under it), and folded sub-panels for the
rest: Capture Settings, Training Settings, Model (everything done with a model: each action's button there alone),
Backend."""
from __future__ import annotations

import time
from pathlib import Path

import bpy

from ..core.errors import SplatwrightError
from ..core.reconstruction import is_video
from ..logic.dataset import training_count
from ..logic.defaults import CPU, device_of, machine_device, schedule_steps, training_seconds
from ..logic.placement import uniform_scale
from ..ops.backend import (SPLATWRIGHT_OT_backend_check, SPLATWRIGHT_OT_backend_kill, SPLATWRIGHT_OT_backend_start,
                           SPLATWRIGHT_OT_backend_stop)
from ..ops.capture import SPLATWRIGHT_OT_capture_cancel
from ..ops.colmap import (SPLATWRIGHT_OT_import_colmap, SPLATWRIGHT_OT_reconstruct, SPLATWRIGHT_OT_reconstruct_cancel,
                          reconstruction_progress)
from ..ops.flow import SPLATWRIGHT_OT_capture_train, running_flow
from ..ops.formats import SPLATWRIGHT_OT_export_splats, SPLATWRIGHT_OT_import_splats
from ..ops.splats import (SPLATWRIGHT_OT_add_crop_box, SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_keep_outside,
                          SPLATWRIGHT_OT_show_model, SPLATWRIGHT_OT_store_in_blend)
from ..ops.training import (SPLATWRIGHT_OT_train_pause, SPLATWRIGHT_OT_train_resume, SPLATWRIGHT_OT_train_start,
                            SPLATWRIGHT_OT_train_stop)
from ..ops.view import SPLATWRIGHT_OT_render_preview
from ..render import overlay
from ..scene import linked, live, native
from ..scene.colmap import imported_model, photo_counts
from ..scene.folders import captures_home, movable_capture, unsaved_captures
from ..scene.reading import animation_frames, capture_cameras, capture_size
from ..scene.session import not_connected
from ..scene.splats import SESSION_KEY, active_model, crop_box, model_choice, model_matrix, splat_objects
from .kit import SplatsPanel, buttons, duration, labels, primary, progress, reason_line

CONNECTION_ICONS = {"connected": "CHECKMARK", "connecting": "TIME", "lost": "ERROR", "disconnected": "X"}
SOURCE_SETTINGS = {"ORBIT": ("orbit_count",), "CAMERAS": ("only_selected",),
                   "ANIMATION": ("frame_step", "moving_scene"), "RIG_ANIMATION": ("frame_step", "moving_scene"),
                   "PHOTOS": ()}  # what the main panel shows under From, per source: the rest is folded away


class SPLATWRIGHT_PT_main(SplatsPanel, bpy.types.Panel):
    bl_label = "Splatwright"
    bl_idname = "SPLATWRIGHT_PT_main"

    def draw(self, context):
        layout, s = self.layout, context.scene.splatwright
        col = layout.column()
        col.prop(s, "source")
        for name in SOURCE_SETTINGS[s.source]:
            col.prop(s, name)
        if s.source == "PHOTOS":
            draw_photos(layout, context)
        else:
            draw_estimate(layout, context.scene)
        draw_next_step(layout, context)
        draw_state(layout, context)
        draw_folder(layout, context)


def draw_photos(layout, context) -> None:
    """Photos or a video to make cameras from (its progress while it runs), Import COLMAP for a model made
    elsewhere, and the import trained on."""
    s = context.scene.splatwright
    col = layout.column()
    col.prop(s, "photos_path")
    if is_video(s.photos_path):
        col.prop(s, "video_rate")
    factor, text = reconstruction_progress()
    if text:
        if factor is None:
            layout.label(text=f"{text}…", icon="TIME")
        else:
            progress(layout, factor, text)
        layout.operator(SPLATWRIGHT_OT_reconstruct_cancel.bl_idname, icon="CANCEL")
    else:
        col = layout.column(align=True)
        col.operator(SPLATWRIGHT_OT_reconstruct.bl_idname, icon="OUTLINER_OB_CAMERA")
        col.operator(SPLATWRIGHT_OT_import_colmap.bl_idname, icon="IMPORT")
        if s.photos_path:
            reason_line(layout, context, SPLATWRIGHT_OT_reconstruct)
    empty = imported_model(context)
    if empty is None:
        return
    train, test = photo_counts(empty)
    col = layout.column(align=True)
    labels(col, context, empty.name, icon="IMAGE_DATA")
    col.label(text=f"{train} training photos, {test} held out", icon="BLANK1")


def state() -> str:
    return live.backend.status.get("state") or "idle"


def session_placed(scene) -> bool:
    session = live.backend.status.get("session")
    return any(o[SESSION_KEY] == session for o in splat_objects(scene))


def draw_next_step(layout, context) -> None:
    """The one button for the next step, full width, and one line saying why it cannot run now."""
    if live.capture is not None:
        primary(layout, SPLATWRIGHT_OT_capture_cancel, "CANCEL")
        return
    if state() in ("training", "paused"):
        row = layout.row(align=True)
        row.scale_y = 1.5
        if state() == "training":
            row.operator(SPLATWRIGHT_OT_train_pause.bl_idname, icon="PAUSE")
        else:
            row.operator(SPLATWRIGHT_OT_train_resume.bl_idname, icon="PLAY")
        row.operator(SPLATWRIGHT_OT_train_stop.bl_idname, text="Stop", icon="SNAP_FACE")
        return
    model = bool(live.backend.status.get("gaussians")) and not running_flow()
    if model and not session_placed(context.scene) and not SPLATWRIGHT_OT_add_model.blocked(context):
        primary(layout, SPLATWRIGHT_OT_add_model, "OUTLINER_OB_EMPTY", text="Add to Scene")
        layout.operator(SPLATWRIGHT_OT_capture_train.bl_idname, text="Capture & Train Again", icon="RENDER_STILL")
        return
    primary(layout, SPLATWRIGHT_OT_capture_train, "RENDER_STILL")
    if not running_flow():
        reason_line(layout, context, SPLATWRIGHT_OT_capture_train)


def draw_state(layout, context) -> None:
    """What runs now, right under the button: the capture's or the training's progress, or the flow's step."""
    job = live.capture
    if job is not None:
        left = job.seconds_left()
        progress(layout, job.done / job.total, f"View {min(job.done + 1, job.total)}/{job.total}")
        layout.label(text=f"{duration(left)} left" if left is not None else "Rendering", icon="TIME")
        return
    if doing := running_flow():
        layout.label(text=f"{doing}…", icon="TIME")
    b = live.backend
    if b.connection == "lost" or (b.last_error and b.connection != "connected"):
        labels(layout, context, b.last_error or b.detail, icon="ERROR")
    draw_training_stats(layout, b)


def draw_training_stats(layout, b) -> None:
    """The training's progress bar, loss, PSNR, Gaussians and time left."""
    step, total = b.status.get("step", 0), b.status.get("iterations", 0)
    if not total:
        return
    progress(layout, min(1.0, step / total), f"{b.status.get('state', '').title()} {step}/{total}")
    p = b.progress
    col = layout.column(align=True)
    if p.get("loss") is not None:
        col.label(text=f"Loss {p['loss']:.4f}")
        col.label(text=f"PSNR {p['psnr']:.2f} dB")
    if gaussians := p.get("gaussians") or b.status.get("gaussians"):
        col.label(text=f"{gaussians:,} Gaussians")
    if b.status.get("state") == "training":
        left = b.clock.remaining(time.monotonic())
        col.label(text=f"{duration(left)} left" if left is not None else "Measuring speed", icon="TIME")


def draw_folder(layout, context) -> None:
    """Where captures go; while the file is unsaved, the add-on's data folder, said so."""
    s = context.scene.splatwright
    if s.source == "PHOTOS":
        return
    if unsaved_captures(s.folder):
        labels(layout, context, f"Unsaved file: captures go to {captures_home()}", icon="FILE_FOLDER")
    if movable_capture(context.scene) is not None:
        layout.operator("splatwright.move_captures", icon="FILE_FOLDER")


def draw_estimate(layout, scene) -> None:
    """How many views at what size, and about how long training them takes on the backend's device (before one
    connects, on this machine's likely device); the time left corrects itself once training runs."""
    s = scene.splatwright
    width, height = capture_size(scene)
    # (views at each frame, frames): Animation from the Rig takes the orbit's cameras where there are none
    per_frame, frames = {"ORBIT": lambda: (s.orbit_count, 1), "ANIMATION": lambda: (1, len(animation_frames(scene))),
                         "CAMERAS": lambda: (len(capture_cameras(scene)), 1),
                         "RIG_ANIMATION": lambda: (len(capture_cameras(scene)) or s.orbit_count,
                                                   len(animation_frames(scene))),
                         }[s.source]()
    views = per_frame * frames
    # The views the backend fits its schedule to (train.fit_to_views): capture.py holds out every test_every-th
    # frame of an animation, else every test_every-th camera (at each frame of a rig's animation); a capture over
    # time is not fitted.
    if s.moving_scene and s.source in ("ANIMATION", "RIG_ANIMATION"):
        training_views = 0
    elif s.source == "ANIMATION":
        training_views = training_count(frames, s.test_every)
    else:
        training_views = training_count(per_frame, s.test_every) * frames
    col = layout.column(align=True)
    col.label(text=f"{views} views, {width}x{height} px", icon="RENDER_RESULT")
    b = live.backend
    device = (b.capabilities.get("device") if b.connection == "connected" else None) or machine_device()
    steps = schedule_steps(device, s.preset.lower(), s.iterations if s.custom_steps else None, training_views)
    seconds = training_seconds(device, steps, width, height)
    col.label(text=f"{steps} steps, ~{duration(seconds)}", icon="TIME")
    if device_of(device) == CPU:
        col.label(text="CPU: a quick preview", icon="INFO")


class SubPanel(SplatsPanel):
    bl_parent_id = SPLATWRIGHT_PT_main.bl_idname
    bl_options = {"DEFAULT_CLOSED"}


class SPLATWRIGHT_PT_capture(SubPanel, bpy.types.Panel):
    bl_label = "Capture Settings"

    def draw(self, context):
        layout, s = self.layout, context.scene.splatwright
        col = layout.column()
        if s.source in ("CAMERAS", "RIG_ANIMATION") and "only_selected" not in SOURCE_SETTINGS[s.source]:
            col.prop(s, "only_selected")
        if s.source == "ORBIT" or (s.source == "RIG_ANIMATION" and not capture_cameras(context.scene)):
            for name in ("orbit_shape", "orbit_target", "orbit_radius", "orbit_lens", "orbit_seed"):
                col.prop(s, name)
            if "orbit_count" not in SOURCE_SETTINGS[s.source]:
                col.prop(s, "orbit_count")
        col = layout.column()
        if s.source != "PHOTOS":
            col.prop(s, "resolution_percentage", text="Scale")
        col.prop(s, "max_side")  # the photos' too
        if s.source != "PHOTOS":
            for name in ("render_engine", "samples", "test_every", "transparent", "initial_points"):
                col.prop(s, name)
            if s.initial_points:
                col.prop(s, "point_count")
            col.prop(s, "folder")
        if s.capture_folder:
            col = layout.column(align=True)
            col.label(text="Last capture:", icon="FILE_FOLDER")
            col.label(text=Path(s.capture_folder).name)  # one word, too long for a line after an icon


class SPLATWRIGHT_PT_train(SubPanel, bpy.types.Panel):
    bl_label = "Training Settings"

    def draw(self, context):
        layout, s = self.layout, context.scene.splatwright
        col = layout.column()
        col.prop(s, "custom_steps")
        if s.custom_steps:
            col.prop(s, "iterations")
        else:
            col.prop(s, "preset")  # the preset sets the steps: with Custom Steps on it has nothing to set
        col.prop(s, "sh_degree")
        col.prop(s, "max_gaussians", text="Max Gaussians" if s.max_gaussians else "Max Gaussians: Auto")
        col.label(text="Background")
        col.row().prop(s, "background", expand=True)
        if s.background == "CUSTOM":
            col.prop(s, "background_color")
        ops = (SPLATWRIGHT_OT_train_start, SPLATWRIGHT_OT_train_resume)
        col = layout.column(align=True)
        col.operator(SPLATWRIGHT_OT_train_start.bl_idname, text="Train Again", icon="PLAY")
        if state() in ("stopped", "failed"):
            col.operator(SPLATWRIGHT_OT_train_resume.bl_idname, icon="FILE_REFRESH")
        reason_line(layout, context, *ops)


def problem(obj, scene) -> str:
    """Why `obj`'s splats are not drawn in `scene`, or ''."""
    if obj.type != "EMPTY":  # Blender draws a native object's splats under any transform, with no backend
        return ""
    try:
        uniform_scale(model_matrix(obj), obj.name)
        model_choice(obj, scene)
    except SplatwrightError as e:
        return str(e)
    return not_connected() or overlay.refusal(obj.name)


class SPLATWRIGHT_PT_model(SubPanel, bpy.types.Panel):
    """The model: import, export, add to scene, show, crop, preview, and (Blender 5.3 and later) where the active
    native object keeps its model; and the scene's splat objects."""
    bl_label = "Model"

    def draw(self, context):
        layout = self.layout
        if gaussians := live.backend.status.get("gaussians"):
            layout.label(text=f"Showing {gaussians:,} Gaussians")
        ops = [SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_show_model, SPLATWRIGHT_OT_add_crop_box,
               SPLATWRIGHT_OT_render_preview, SPLATWRIGHT_OT_import_splats, SPLATWRIGHT_OT_export_splats]
        icons = ["OUTLINER_OB_EMPTY", "HIDE_OFF", "MESH_CUBE", "IMAGE_DATA", "IMPORT", "EXPORT"]
        if native.available():  # the one of Keep Outside .blend and Store in .blend that fits the active object
            obj = active_model(context)
            kept_outside = obj is not None and bool(native.linked_path(obj))
            ops.append(SPLATWRIGHT_OT_store_in_blend if kept_outside else SPLATWRIGHT_OT_keep_outside)
            icons.append("FILE_BLEND" if kept_outside else "EXTERNAL_DRIVE")
        buttons(layout, context, *ops, icons=icons,
                texts=("Add to Scene", "Show Model", "Add Crop Box", "Preview", "Import", "Export"),
                explain_first=SPLATWRIGHT_OT_render_preview)  # why there is no model to act on, first
        for obj in splat_objects(context.scene):
            session = obj[SESSION_KEY]
            labels(layout, context, f"{obj.name}: session {session}" if session else f"{obj.name}: a linked file",
                   icon="OUTLINER_OB_EMPTY")
            if (box := crop_box(obj)) is not None:
                labels(layout, context, f"cropped to {box.name}", icon="MESH_CUBE")
            if kept := linked.state(obj):
                labels(layout, context, kept, icon="LINKED")
            if reason := problem(obj, context.scene):
                labels(layout, context, reason, icon="INFO")


class SPLATWRIGHT_PT_backend(SubPanel, bpy.types.Panel):
    bl_label = "Backend"

    def draw_header_preset(self, context):
        self.layout.label(text="", icon=CONNECTION_ICONS.get(live.backend.connection, "QUESTION"))

    def draw(self, context):
        layout, b = self.layout, live.backend
        labels(layout, context, f"{b.connection.title()}{': ' + b.detail if b.detail else ''}",
               icon=CONNECTION_ICONS.get(b.connection, "QUESTION"))
        if b.connection == "connected":
            caps, status = b.capabilities, b.status
            labels(layout, context, f"GPU: {caps.get('gpu') or 'none, ' + str(caps.get('device'))}", icon="MEMORY")
            memory = b.progress.get("gpu_memory_mb")
            if memory is not None:
                total = f" of {caps['gpu_memory_gb']} GB" if caps.get("gpu_memory_gb") else ""
                labels(layout, context, f"{memory / 1024:.2f} GB used{total}")
            if status.get("session"):
                views = status.get("views", 0)
                imported = status.get("checkpoint") and not views  # a saved model, and no views to train on
                labels(layout, context, f"Session {status['session']}: "
                                        f"{'an imported model; Add Model to Scene places it' if imported else str(views) + ' views'}")
        if b.last_error and b.last_error != b.detail:
            labels(layout, context, b.last_error, icon="ERROR")
        row = layout.row(align=True)
        for op, icon, text in ((SPLATWRIGHT_OT_backend_start, "PLAY", "Start"),
                               (SPLATWRIGHT_OT_backend_stop, "QUIT", "Stop"),
                               (SPLATWRIGHT_OT_backend_kill, "CANCEL", "Kill")):
            row.operator(op.bl_idname, text=text, icon=icon)
        layout.operator(SPLATWRIGHT_OT_backend_check.bl_idname, icon="CHECKMARK")


CLASSES = (SPLATWRIGHT_PT_main, SPLATWRIGHT_PT_capture, SPLATWRIGHT_PT_train, SPLATWRIGHT_PT_model,
           SPLATWRIGHT_PT_backend)
register, unregister = bpy.utils.register_classes_factory(CLASSES)

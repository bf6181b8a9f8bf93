"""The 'Splats' tab of the 3D viewport's sidebar: Backend, Capture, Photos, Train, View, Export, Splats in the
Scene."""
from __future__ import annotations

from pathlib import Path

import bpy

from ..core.errors import SplatwrightError
from ..logic.dataset import training_count
from ..logic.defaults import CPU, device_of, schedule_steps, training_seconds
from ..logic.placement import uniform_scale
from ..ops.backend import (SPLATWRIGHT_OT_backend_check, SPLATWRIGHT_OT_backend_kill, SPLATWRIGHT_OT_backend_start,
                           SPLATWRIGHT_OT_backend_stop)
from ..ops.capture import SPLATWRIGHT_OT_capture, SPLATWRIGHT_OT_capture_cancel, SPLATWRIGHT_OT_send_views
from ..ops.colmap import SPLATWRIGHT_OT_import_colmap, SPLATWRIGHT_OT_send_photos
from ..ops.formats import SPLATWRIGHT_OT_export_splats, SPLATWRIGHT_OT_import_splats
from ..ops.splats import SPLATWRIGHT_OT_add_crop_box, SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_show_model
from ..ops.training import (SPLATWRIGHT_OT_train_pause, SPLATWRIGHT_OT_train_resume, SPLATWRIGHT_OT_train_start,
                            SPLATWRIGHT_OT_train_stop)
from ..ops.view import SPLATWRIGHT_OT_render_preview
from ..render import overlay
from ..scene import live
from ..scene.colmap import imported_model, photo_counts
from ..scene.reading import animation_frames, capture_cameras, capture_size
from ..scene.session import not_connected
from ..scene.splats import SESSION_KEY, crop_box, model_choice, model_matrix, splat_objects
from .kit import SplatsPanel, buttons, duration, labels, progress

CONNECTION_ICONS = {"connected": "CHECKMARK", "connecting": "TIME", "lost": "ERROR", "disconnected": "X"}
class SPLATWRIGHT_PT_backend(SplatsPanel, bpy.types.Panel):
    bl_label = "Backend"

    def draw(self, context):
        layout, b = self.layout, live.backend
        labels(layout, context, f"{b.connection.title()}{': ' + b.detail if b.detail else ''}",
               icon=CONNECTION_ICONS.get(b.connection, "QUESTION"))
        if b.connection == "connected":
            caps, status = b.capabilities, b.status
            gpu = caps.get("gpu") or f"no GPU ({caps.get('device')})"
            total = f" of {caps['gpu_memory_gb']} GB" if caps.get("gpu_memory_gb") else ""
            layout.label(text=f"GPU: {gpu}", icon="MEMORY")
            memory = b.progress.get("gpu_memory_mb")
            if memory is not None:
                layout.label(text=f"Memory: {memory / 1024:.2f} GB used{total}")
            if status.get("session"):
                views = status.get("views", 0)
                imported = status.get("checkpoint") and not views  # a saved model, and no views to train on
                held = "an imported model; Add Model to Scene places it" if imported else f"{views} views"
                labels(layout, context, f"Session {status['session']}: {held}")
        if b.last_error and b.last_error != b.detail:
            labels(layout, context, b.last_error, icon="ERROR")
        buttons(layout, context, SPLATWRIGHT_OT_backend_start, SPLATWRIGHT_OT_backend_stop,
                SPLATWRIGHT_OT_backend_kill, icons=("PLAY", "PAUSE", "CANCEL"), texts=("Start", "Stop", "Kill"))
        layout.operator(SPLATWRIGHT_OT_backend_check.bl_idname, icon="CHECKMARK")


class SPLATWRIGHT_PT_capture(SplatsPanel, bpy.types.Panel):
    bl_label = "Capture"

    def draw(self, context):
        layout, s = self.layout, context.scene.splatwright
        job = live.capture
        if job is not None:
            left = job.seconds_left()
            progress(layout, job.done / job.total, f"View {min(job.done + 1, job.total)}/{job.total}" +
                     (f", {duration(left)} left" if left is not None else ""))
            layout.operator(SPLATWRIGHT_OT_capture_cancel.bl_idname, icon="CANCEL")
        layout.prop(s, "source")
        col = layout.column()
        if s.source in ("ANIMATION", "RIG_ANIMATION"):
            col.prop(s, "frame_step")
            col.prop(s, "moving_scene")
        if s.source in ("CAMERAS", "RIG_ANIMATION"):
            col.prop(s, "only_selected")
        if s.source == "ORBIT" or (s.source == "RIG_ANIMATION" and not capture_cameras(context.scene)):
            for name in ("orbit_shape", "orbit_target", "orbit_count", "orbit_radius", "orbit_lens", "orbit_seed"):
                col.prop(s, name)
        col = layout.column()
        for name in ("resolution_percentage", "max_side", "render_engine", "samples", "test_every", "transparent",
                     "initial_points"):
            col.prop(s, name)
        if s.initial_points:
            col.prop(s, "point_count")
        col.prop(s, "folder")
        draw_estimate(layout, context.scene)
        buttons(layout, context, SPLATWRIGHT_OT_capture, SPLATWRIGHT_OT_send_views, icons=("RENDER_STILL", "EXPORT"))
        if s.capture_folder:
            layout.label(text=f"Last capture: {Path(s.capture_folder).name}")


class SPLATWRIGHT_PT_photos(SplatsPanel, bpy.types.Panel):
    bl_label = "Photos"

    def draw(self, context):
        layout = self.layout
        empty = imported_model(context)
        if empty is not None:
            train, test = photo_counts(empty)
            layout.label(text=f"{empty.name}: {train} training, {test} held-out photos", icon="IMAGE_DATA")
        layout.prop(context.scene.splatwright, "max_side")
        buttons(layout, context, SPLATWRIGHT_OT_import_colmap, SPLATWRIGHT_OT_send_photos, icons=("IMPORT", "EXPORT"))


def draw_estimate(layout, scene) -> None:
    """How many views at what size, how long training them takes on the connected backend's device, and
    that the CPU trains a preview."""
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
    col.label(text=f"{views} views of {width}x{height} px", icon="RENDER_RESULT")
    b = live.backend
    device = b.capabilities.get("device") if b.connection == "connected" else None
    if device:
        steps = schedule_steps(device, s.preset.lower(), s.iterations if s.custom_steps else None,
                               training_views)
        seconds = training_seconds(device, steps, width, height)
        col.label(text=f"Training: about {duration(seconds)} ({steps} steps)", icon="TIME")
        if device_of(device) == CPU:
            col.label(text="CPU backend: a quick preview", icon="INFO")
            col.label(text="(a CUDA GPU trains full size)")


class SPLATWRIGHT_PT_train(SplatsPanel, bpy.types.Panel):
    bl_label = "Train"

    def draw(self, context):
        layout, s, b = self.layout, context.scene.splatwright, live.backend
        draw_training_stats(layout, b)  # first, so they stay in sight while training
        col = layout.column()
        col.prop(s, "preset")
        col.prop(s, "custom_steps")
        if s.custom_steps:
            col.prop(s, "iterations")
        col.prop(s, "sh_degree")
        col.prop(s, "max_gaussians", text="Gaussian Cap" if s.max_gaussians else "Gaussian Cap: Auto")
        col.prop(s, "background")
        if s.background == "CUSTOM":
            col.prop(s, "background_color")
        buttons(layout, context, SPLATWRIGHT_OT_train_start, SPLATWRIGHT_OT_train_pause,
                SPLATWRIGHT_OT_train_resume, SPLATWRIGHT_OT_train_stop, icons=("PLAY", "PAUSE", "FILE_REFRESH", "SNAP_FACE"))


def draw_training_stats(layout, b) -> None:
    """The training's progress bar, loss, PSNR, Gaussians, speed and time left."""
    step, total = b.status.get("step", 0), b.status.get("iterations", 0)
    if total:
        progress(layout, step / total, f"{b.status.get('state', '').title()} {step}/{total}")
    p = b.progress
    if p:
        col = layout.column(align=True)
        if p.get("loss") is not None:
            col.label(text=f"Loss {p['loss']:.4f}   PSNR {p['psnr']:.2f} dB")
        col.label(text=f"{p.get('gaussians', 0):,} Gaussians")
        rate = p.get("its_per_s") or 0.0
        eta = duration((total - step) / rate) if rate > 0 and total > step else "-"
        col.label(text=f"{rate:.1f} it/s   ETA {eta}")


class SPLATWRIGHT_PT_view(SplatsPanel, bpy.types.Panel):
    bl_label = "View"

    def draw(self, context):
        if gaussians := live.backend.status.get("gaussians"):
            self.layout.label(text=f"Showing {gaussians:,} Gaussians")
        buttons(self.layout, context, SPLATWRIGHT_OT_import_splats, SPLATWRIGHT_OT_render_preview,
                icons=("IMPORT", "IMAGE_DATA"))


class SPLATWRIGHT_PT_export(SplatsPanel, bpy.types.Panel):
    bl_label = "Export"

    def draw(self, context):
        buttons(self.layout, context, SPLATWRIGHT_OT_export_splats, icons=("EXPORT",))


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


class SPLATWRIGHT_PT_scene_splats(SplatsPanel, bpy.types.Panel):
    bl_label = "Splats in the Scene"

    def draw(self, context):
        layout = self.layout
        buttons(layout, context, SPLATWRIGHT_OT_add_model, SPLATWRIGHT_OT_show_model, SPLATWRIGHT_OT_add_crop_box,
                icons=("OUTLINER_OB_EMPTY", "HIDE_OFF", "MESH_CUBE"))
        for obj in splat_objects(context.scene):
            layout.label(text=f"{obj.name}: session {obj[SESSION_KEY]}", icon="OUTLINER_OB_EMPTY")
            if (box := crop_box(obj)) is not None:
                layout.label(text=f"cropped to {box.name}", icon="MESH_CUBE")
            if reason := problem(obj, context.scene):
                labels(layout, context, reason, icon="INFO")


CLASSES = (SPLATWRIGHT_PT_backend, SPLATWRIGHT_PT_capture, SPLATWRIGHT_PT_photos, SPLATWRIGHT_PT_train,
           SPLATWRIGHT_PT_view, SPLATWRIGHT_PT_export, SPLATWRIGHT_PT_scene_splats)
register, unregister = bpy.utils.register_classes_factory(CLASSES)

"""The 'Splats' tab of the 3D viewport's sidebar: Backend, Capture, Train, View, Export."""
from __future__ import annotations

from pathlib import Path

import bpy

from . import live
from .operators import (SPLATWRIGHT_OT_backend_check, SPLATWRIGHT_OT_backend_kill, SPLATWRIGHT_OT_backend_start,
                        SPLATWRIGHT_OT_backend_stop, SPLATWRIGHT_OT_capture, SPLATWRIGHT_OT_export_ply,
                        SPLATWRIGHT_OT_load_ply, SPLATWRIGHT_OT_render_preview, SPLATWRIGHT_OT_send_views,
                        SPLATWRIGHT_OT_train_pause, SPLATWRIGHT_OT_train_resume, SPLATWRIGHT_OT_train_start,
                        SPLATWRIGHT_OT_train_stop)

CONNECTION_ICONS = {"connected": "CHECKMARK", "connecting": "TIME", "lost": "ERROR", "disconnected": "X"}


def buttons(layout, context, *ops, icons=()) -> None:
    """A row of operator buttons (disabled by their poll), then why the disabled ones cannot run."""
    row = layout.row(align=True)
    for i, op in enumerate(ops):
        row.operator(op.bl_idname, icon=icons[i] if i < len(icons) else "NONE")
    reasons = []
    for op in ops:
        reason = op.blocked(context)
        if reason and reason not in reasons:
            reasons.append(reason)
    for reason in reasons:
        layout.label(text=reason, icon="INFO")


def progress(layout, factor: float, text: str) -> None:
    if bpy.app.version >= (4, 0, 0):
        layout.progress(factor=factor, type="BAR", text=text)
    else:
        layout.label(text=f"{text}  ({factor:.0%})")


def duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h {seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m {seconds % 60:02d}s"


class SplatsPanel:
    bl_space_type = "VIEW_3D"
    bl_region_type = "UI"
    bl_category = "Splats"


class SPLATWRIGHT_PT_backend(SplatsPanel, bpy.types.Panel):
    bl_label = "Backend"

    def draw(self, context):
        layout, b = self.layout, live.backend
        layout.label(text=f"{b.connection.title()}{': ' + b.detail if b.detail else ''}",
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
                layout.label(text=f"Session {status['session']}: {status.get('views', 0)} views")
        if b.last_error:
            layout.label(text=b.last_error, icon="ERROR")
        buttons(layout, context, SPLATWRIGHT_OT_backend_start, SPLATWRIGHT_OT_backend_stop,
                SPLATWRIGHT_OT_backend_kill, icons=("PLAY", "PAUSE", "CANCEL"))
        layout.operator(SPLATWRIGHT_OT_backend_check.bl_idname, icon="CHECKMARK")


class SPLATWRIGHT_PT_capture(SplatsPanel, bpy.types.Panel):
    bl_label = "Capture"

    def draw(self, context):
        layout, s = self.layout, context.scene.splatwright
        job = live.capture
        if job is not None:
            progress(layout, job.done / job.total, f"Capturing {job.done}/{job.total} (Esc cancels)")
        layout.prop(s, "source")
        col = layout.column()
        if s.source == "CAMERAS":
            col.prop(s, "only_selected")
        elif s.source == "ANIMATION":
            col.prop(s, "frame_step")
        else:
            for name in ("orbit_shape", "orbit_target", "orbit_count", "orbit_radius", "orbit_lens", "orbit_seed"):
                col.prop(s, name)
        col = layout.column()
        for name in ("resolution_percentage", "test_every", "transparent", "initial_points"):
            col.prop(s, name)
        if s.initial_points:
            col.prop(s, "point_count")
        col.prop(s, "folder")
        buttons(layout, context, SPLATWRIGHT_OT_capture, SPLATWRIGHT_OT_send_views, icons=("RENDER_STILL", "EXPORT"))
        if s.capture_folder:
            layout.label(text=f"Last capture: {Path(s.capture_folder).name}")


class SPLATWRIGHT_PT_train(SplatsPanel, bpy.types.Panel):
    bl_label = "Train"

    def draw(self, context):
        layout, s, b = self.layout, context.scene.splatwright, live.backend
        col = layout.column()
        col.prop(s, "preset")
        col.prop(s, "custom_steps")
        if s.custom_steps:
            col.prop(s, "iterations")
        col.prop(s, "sh_degree")
        col.prop(s, "max_gaussians")
        col.prop(s, "background")
        if s.background == "CUSTOM":
            col.prop(s, "background_color")
        buttons(layout, context, SPLATWRIGHT_OT_train_start, SPLATWRIGHT_OT_train_pause,
                SPLATWRIGHT_OT_train_resume, SPLATWRIGHT_OT_train_stop, icons=("PLAY", "PAUSE", "FILE_REFRESH", "SNAP_FACE"))
        step, total = b.status.get("step", 0), b.status.get("iterations", 0)
        if total:
            progress(layout, step / total, f"{b.status.get('state', '')} {step}/{total}")
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
        layout = self.layout
        buttons(layout, context, SPLATWRIGHT_OT_load_ply, SPLATWRIGHT_OT_render_preview,
                icons=("IMPORT", "IMAGE_DATA"))
        gaussians = live.backend.status.get("gaussians")
        if gaussians:
            layout.label(text=f"Showing {gaussians:,} Gaussians")


class SPLATWRIGHT_PT_export(SplatsPanel, bpy.types.Panel):
    bl_label = "Export"

    def draw(self, context):
        buttons(self.layout, context, SPLATWRIGHT_OT_export_ply, icons=("EXPORT",))


CLASSES = (SPLATWRIGHT_PT_backend, SPLATWRIGHT_PT_capture, SPLATWRIGHT_PT_train, SPLATWRIGHT_PT_view,
           SPLATWRIGHT_PT_export)
register, unregister = bpy.utils.register_classes_factory(CLASSES)

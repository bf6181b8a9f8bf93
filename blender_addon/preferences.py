"""Add-on preferences: where the backend runs (a local Python or a remote host) and its environment."""
from __future__ import annotations

import bpy
from bpy.props import EnumProperty, IntProperty, StringProperty

from . import live
from .runtime import ConnectSettings, defaults

_DEFAULTS = defaults()
SETUP_LOG_LINES = 12


class SPLATWRIGHT_AP_preferences(bpy.types.AddonPreferences):
    bl_idname = __package__

    mode: EnumProperty(name="Backend", default="LOCAL", items=[
        ("LOCAL", "Local", "Start the backend on this computer with the Python below"),
        ("REMOTE", "Remote", "Connect to a backend already running elsewhere (python -m backend serve)"),
    ])
    python: StringProperty(name="Python", subtype="FILE_PATH", default=_DEFAULTS.get("python", ""),
                           description="Python with torch to run the backend (the .venv that ./run setup makes)")
    backend_root: StringProperty(name="Backend folder", subtype="DIR_PATH",
                                 default=_DEFAULTS.get("backend_root", ""),
                                 description="The Splatwright checkout holding backend/ and ./run")
    workdir: StringProperty(name="Sessions folder", subtype="DIR_PATH", default="",
                            description="Where the backend keeps sessions (empty: out/sessions in the backend folder)")
    host: StringProperty(name="Host", default="127.0.0.1")
    port: IntProperty(name="Port", default=7380, min=1, max=65535)
    token: StringProperty(name="Token", subtype="PASSWORD",
                          description="The secret in the remote backend's --token-file")

    def connect_settings(self) -> ConnectSettings:
        return ConnectSettings(self.mode, bpy.path.abspath(self.python), bpy.path.abspath(self.backend_root),
                               bpy.path.abspath(self.workdir), self.host, self.port, self.token)

    def draw(self, context):
        layout = self.layout
        layout.row().prop(self, "mode", expand=True)
        if self.mode == "LOCAL":
            layout.prop(self, "backend_root")
            layout.prop(self, "python")
            layout.prop(self, "workdir")
            draw_setup(layout)
        else:
            layout.prop(self, "host")
            layout.prop(self, "port")
            layout.prop(self, "token")
        row = layout.row()
        for op, icon in (("check", "CHECKMARK"), ("start", "PLAY"), ("stop", "PAUSE"), ("kill", "CANCEL")):
            row.operator(f"splatwright.backend_{op}", icon=icon)
        draw_capabilities(layout)


def draw_setup(layout) -> None:
    layout.operator("splatwright.setup_environment", icon="CONSOLE")
    job = live.setup
    if job is None:
        return
    box = layout.box()
    code = job.returncode
    state = "running..." if code is None else ("done" if code == 0 else f"failed (exit code {code})")
    box.label(text=f"./run setup: {state}", icon="TIME" if code is None else ("CHECKMARK" if code == 0 else "ERROR"))
    col = box.column(align=True)
    col.scale_y = 0.7
    for line in job.log.last(SETUP_LOG_LINES):
        col.label(text=line)


def draw_capabilities(layout) -> None:
    caps = live.backend.capabilities if live.backend else {}
    if not caps:
        return
    box = layout.box()
    gpu = caps.get("gpu") or "none"
    memory = f", {caps['gpu_memory_gb']} GB" if caps.get("gpu_memory_gb") else ""
    for text in (f"Python {caps.get('python')}, torch {caps.get('torch')}, numpy {caps.get('numpy')}",
                 f"CUDA: {'yes' if caps.get('cuda_available') else 'no'} ({caps.get('torch_cuda') or 'CPU build'})",
                 f"GPU: {gpu}{memory}",
                 f"Rasterizer: {caps.get('rasterizer')} on {caps.get('device')}"):
        box.label(text=text)
    if caps.get("cuda_rasterizer_detail"):
        box.label(text=str(caps["cuda_rasterizer_detail"]), icon="INFO")


def prefs(context) -> SPLATWRIGHT_AP_preferences:
    return context.preferences.addons[__package__].preferences


def register():
    bpy.utils.register_class(SPLATWRIGHT_AP_preferences)


def unregister():
    bpy.utils.unregister_class(SPLATWRIGHT_AP_preferences)

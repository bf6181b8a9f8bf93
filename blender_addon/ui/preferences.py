"""Add-on preferences: where the backend runs (a local Python or a remote host), and the backend's own
environment, which Set Up Backend makes in Blender's per-user data folder for the add-on."""
from __future__ import annotations

import time

import bpy
from bpy.props import EnumProperty, IntProperty, StringProperty

from ..core import protocol
from ..logic.environment import SESSIONS, VENV, readiness, venv_python
from ..logic.runtime import ConnectSettings
from ..scene import live
from ..scene.addon import PACKAGE, data_folder, sources
from .kit import progress

SETUP_LOG_LINES = 12


class SPLATWRIGHT_AP_preferences(bpy.types.AddonPreferences):
    bl_idname = PACKAGE

    mode: EnumProperty(name="Backend", default="LOCAL", items=[
        ("LOCAL", "Local", "Start the backend on this computer with the Python below"),
        ("REMOTE", "Remote", "Connect to a backend already running elsewhere (python -m backend serve)"),
    ])
    python: StringProperty(name="Python", subtype="FILE_PATH", default="",
                           description="A Python with torch to run the backend, such as an environment you "
                                       "already have (empty: the environment Set Up Backend makes)")
    base_python: StringProperty(name="Base Python", subtype="FILE_PATH", default="",
                                description="The Python that Set Up Backend builds the backend's environment "
                                            "from (empty: Blender's own)")
    workdir: StringProperty(name="Sessions Folder", subtype="DIR_PATH", default="",
                            description="Where the backend keeps sessions (empty: sessions/ in the add-on's "
                                        "data folder)")
    host: StringProperty(name="Host", default="127.0.0.1")
    port: IntProperty(name="Port", default=protocol.DEFAULT_PORT, min=1, max=65535)
    token: StringProperty(name="Token", subtype="PASSWORD",
                          description="The secret in the remote backend's --token-file")

    def backend_python(self) -> str:
        return bpy.path.abspath(self.python) or str(venv_python(data_folder() / VENV))

    def connect_settings(self) -> ConnectSettings:
        workdir = bpy.path.abspath(self.workdir) or str(data_folder() / SESSIONS)
        return ConnectSettings(self.mode, self.backend_python(), str(sources()), workdir, self.host, self.port,
                               self.token)

    def draw(self, context):
        layout = self.layout
        layout.row().prop(self, "mode", expand=True)
        if self.mode == "LOCAL":
            layout.prop(self, "python")
            layout.prop(self, "workdir")
            draw_setup(layout, self)
        else:
            layout.prop(self, "host")
            layout.prop(self, "port")
            layout.prop(self, "token")
        row = layout.row()
        for op, icon in (("check", "CHECKMARK"), ("start", "PLAY"), ("stop", "PAUSE"), ("kill", "CANCEL")):
            row.operator(f"splatwright.backend_{op}", icon=icon)
        draw_capabilities(layout)


def draw_setup(layout, prefs: SPLATWRIGHT_AP_preferences) -> None:
    """The backend's environment: where it is, what it has, and Set Up Backend with its progress and log."""
    venv = data_folder() / VENV
    box = layout.box()
    box.label(text=f"Backend environment{' (not used while Python is set)' if prefs.python else ''}: {venv}")
    found = readiness(venv, sources())
    if found:
        box.label(text=f"Ready: Python {found['python']}, torch {found['torch']} "
                       f"({'CUDA ' + found['cuda'] if found.get('cuda') else 'CPU'})", icon="CHECKMARK")
        if found.get("kernels_report"):
            box.label(text=f"CUDA kernels: {found['kernels_report']}", icon="INFO")
    else:
        box.label(text="Not set up: Set Up Backend installs torch and the backend's requirements there",
                  icon="INFO")
    box.prop(prefs, "base_python")
    row = box.row()
    row.operator("splatwright.setup_backend", icon="CONSOLE")
    row.operator("splatwright.setup_cancel", icon="CANCEL")
    job = live.setup
    if job is None:
        return
    if job.returncode is None:
        elapsed = int(time.monotonic() - job.step_started)
        progress(box, job.progress, f"{job.step} ({elapsed // 60}:{elapsed % 60:02d})")
    else:
        box.label(text=f"Set-up {job.state}", icon="CHECKMARK" if job.returncode == 0 else "ERROR")
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


def register():
    bpy.utils.register_class(SPLATWRIGHT_AP_preferences)


def unregister():
    bpy.utils.unregister_class(SPLATWRIGHT_AP_preferences)

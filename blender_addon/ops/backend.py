"""The backend's operators: set up its environment, start, check, stop and kill it, and the report operator that
puts its messages into Blender's reports. Each returns at once: requests go to the backend worker thread and
their results come back through the live.poll timer."""
import sys

import bpy
from bpy.props import EnumProperty, StringProperty
from bpy.types import Operator

from ..core.errors import SplatwrightError
from ..logic.environment import Setup, blender_python
from ..scene import live
from ..scene.addon import data_folder, prefs, sources
from .base import Guarded, button, connect


class SPLATWRIGHT_OT_report(Operator):
    """Show a message from the backend as a Blender report (live.report says how it gets there)"""
    bl_idname = "splatwright.report"
    bl_label = "Splatwright Report"
    bl_options = {"INTERNAL"}

    level: EnumProperty(items=[(x, x.title(), "") for x in ("INFO", "WARNING", "ERROR")])
    message: StringProperty()

    def execute(self, context):
        self.report({self.level}, self.message)
        return {"FINISHED"}

    def invoke(self, context, event):
        """Report from the modal handler: Blender keeps the reports of a running modal operator."""
        wm = context.window_manager
        self._timer = wm.event_timer_add(0.0, window=context.window)
        wm.modal_handler_add(self)
        return {"RUNNING_MODAL"}

    def modal(self, context, event):
        if event.type != "TIMER":
            return {"PASS_THROUGH"}
        context.window_manager.event_timer_remove(self._timer)
        return self.execute(context)


class SPLATWRIGHT_OT_setup_backend(Guarded, Operator):
    """Make or complete the backend's Python environment (torch, the backend's requirements) in the user folder"""
    bl_idname = "splatwright.setup_backend"
    bl_label = "Set Up Backend"

    @classmethod
    def blocked(cls, context):
        if prefs(context).mode != "LOCAL":
            return "Only a local backend is set up from here"
        return "The set-up is running" if setup_running() else ""

    def execute(self, context):
        base = bpy.path.abspath(prefs(context).base_python)
        try:
            base = base or blender_python(sys.executable, getattr(sys, "_base_executable", None), sys.prefix)
            live.setup = Setup(base, data_folder(), sources())
        except (SplatwrightError, OSError) as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        self.report({"INFO"}, f"setting up the backend's environment in {live.setup.venv} with {base}")
        return {"FINISHED"}


def setup_running() -> bool:
    return live.setup is not None and live.setup.returncode is None


SPLATWRIGHT_OT_setup_cancel = button(
    "setup_cancel", "Cancel", "Stop the running set-up (what it installed stays; Set Up Backend goes on from there)",
    blocked=lambda context: "" if setup_running() else "No set-up is running",
    run=lambda context: live.setup.cancel())


SPLATWRIGHT_OT_backend_start = button(
    "backend_start", "Start Backend",
    "Start the local backend (or connect to the remote one); it reopens the scene's last session and model",
    blocked=lambda context: {"connected": "The backend is running", "connecting": "The backend is starting"}.get(
        live.backend.connection, ""),
    run=connect)


class SPLATWRIGHT_OT_backend_check(Guarded, Operator):
    """Connect if needed and show the backend's Python, torch, CUDA, GPU and memory"""
    bl_idname = "splatwright.backend_check"
    bl_label = "Check Backend"

    @classmethod
    def blocked(cls, context):
        return "The backend is starting" if live.backend.connection == "connecting" else ""

    def execute(self, context):
        b = live.backend
        if b.connection != "connected":
            connect(context)  # connecting fetches the capabilities
        else:
            b.call("check", lambda c: c.call("capabilities"), self.show)
        return {"FINISHED"}

    @staticmethod
    def show(caps: dict) -> str:
        live.backend.capabilities = caps
        return (f"Python {caps['python']}, torch {caps['torch']}, CUDA {'yes' if caps['cuda_available'] else 'no'}, "
                f"GPU {caps.get('gpu') or 'none'}, {caps.get('gpu_memory_gb') or '-'} GB")


def backend_not_running(context) -> str:
    b = live.backend
    alive = b.server is not None and b.server.alive
    return "" if b.connection == "connected" or alive else "The backend is not running"


SPLATWRIGHT_OT_backend_stop = button(
    "backend_stop", "Stop Backend",
    "Stop the backend cleanly (training is checkpointed); a remote backend is only disconnected",
    blocked=backend_not_running, run=lambda context: live.backend.stop())


def no_local_process(context) -> str:
    server = live.backend.server
    if prefs(context).mode != "LOCAL":
        return "A remote backend can only be stopped"
    return "" if server is not None and server.alive else "No local backend process is running"


SPLATWRIGHT_OT_backend_kill = button(
    "backend_kill", "Kill Backend",
    "End the local backend process now; frees all of its GPU memory (unsaved training steps are lost)",
    blocked=no_local_process, run=lambda context: live.backend.kill())


CLASSES = (SPLATWRIGHT_OT_report, SPLATWRIGHT_OT_setup_backend, SPLATWRIGHT_OT_setup_cancel,
           SPLATWRIGHT_OT_backend_start, SPLATWRIGHT_OT_backend_check, SPLATWRIGHT_OT_backend_stop,
           SPLATWRIGHT_OT_backend_kill)
register, unregister = bpy.utils.register_classes_factory(CLASSES)

"""Capture: render the views into a dataset and send them to the backend as they finish; Send to Backend: send a
capture made while no backend ran, or a COLMAP import's photos."""
import bpy
from bpy.types import Operator

from ..core.errors import SplatwrightError
from ..scene import live
from ..scene.capture import Capture
from ..scene.folders import move_capture, movable_capture
from ..scene.session import training_runs
from .base import PHOTOS, Guarded, button, cannot_send_views, send_views


class SPLATWRIGHT_OT_capture(Guarded, Operator):
    """Render the views into a NeRF-synthetic dataset and send them to the backend as they finish. Each view
    renders as a Blender render job in the render window; Esc or Cancel Capture stops it"""
    bl_idname = "splatwright.capture"
    bl_label = "Capture Views"

    @classmethod
    def blocked(cls, context):
        if live.capture is not None:
            return "A capture is running (Esc or Cancel Capture stops it)"
        if context.scene.splatwright.source == PHOTOS:
            return "Photos are sent as they are, not captured"
        return training_runs()

    def begin(self, context) -> Capture | None:
        backend = live.backend if live.backend.connection == "connected" else None
        try:
            return Capture(context, backend)
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return None

    def end(self, job: Capture, level: str = "INFO", reason: str = "") -> None:
        """Restore the scene and report the capture in one line."""
        job.finish()
        live.last_capture = job
        self.report({level}, f"{reason}; {job.summary()}" if reason else job.summary())

    def execute(self, context):
        """Scripted use, and Blender without a window: every view in this one call, each render blocking."""
        job = self.begin(context)
        if job is None:
            return {"CANCELLED"}
        try:
            while not job.finished:
                job.step()
        except (SplatwrightError, RuntimeError) as e:  # bpy.ops.render.render raises RuntimeError
            self.end(job, "ERROR", str(e))
            return {"CANCELLED"}
        self.end(job)
        return {"FINISHED"}

    def invoke(self, context, event):
        if bpy.app.background:  # no window, so no render jobs
            return self.execute(context)
        job = self.begin(context)
        if job is None:
            return {"CANCELLED"}
        live.capture = job
        wm = context.window_manager
        self._timer = wm.event_timer_add(0.05, window=context.window)
        wm.modal_handler_add(self)
        return {"RUNNING_MODAL"}

    def modal(self, context, event):
        job = live.capture
        if event.type == "ESC":
            job.cancel("capture cancelled (Esc)")
        elif event.type != "TIMER":
            return {"PASS_THROUGH"}
        elif not job.cancelled:  # by Cancel Capture since the last tick
            done = job.done
            try:
                job.advance(context)  # starts the next render job; never waits for one
            except (SplatwrightError, RuntimeError) as e:
                return self.stop_modal(context, job, "ERROR", str(e))
            if job.done != done:
                live.redraw()
        if job.cancelled:
            return self.stop_modal(context, job, "WARNING", job.stop_reason)
        return self.stop_modal(context, job) if job.finished else {"PASS_THROUGH"}

    def cancel(self, context):
        """Blender ends the operator (a file is loaded, the window closes)."""
        self.stop_modal(context, live.capture, "WARNING", "capture cancelled")

    def stop_modal(self, context, job: Capture, level: str = "INFO", reason: str = ""):
        context.window_manager.event_timer_remove(self._timer)
        live.capture = None
        self.end(job, level, reason)
        live.redraw()
        return {"FINISHED"} if level == "INFO" else {"CANCELLED"}


SPLATWRIGHT_OT_capture_cancel = button(
    "capture_cancel", "Cancel Capture",
    "Stop the running capture now, a render midway included; the views rendered so far are kept and sent",
    blocked=lambda context: "" if live.capture is not None else "No capture is running",
    run=lambda context: live.capture.cancel())


class SPLATWRIGHT_OT_send_views(Guarded, Operator):
    """Send what the scene trains on to the backend: the last capture's training views and initial points, or
    with From set to Photos the selected COLMAP import's training photos and points. Capture & Train sends by
    itself; views the backend already has are not sent again"""
    bl_idname = "splatwright.send_views"
    bl_label = "Send to Backend"

    @classmethod
    def blocked(cls, context):
        return cannot_send_views(context)

    def execute(self, context):
        if reason := send_views(context):
            self.report({"ERROR"}, reason)
            return {"CANCELLED"}
        return {"FINISHED"}


class SPLATWRIGHT_OT_move_captures(Guarded, Operator):
    """Move the capture made while the file was unsaved (in the add-on's data folder) into the Folder beside the
    saved .blend"""
    bl_idname = "splatwright.move_captures"
    bl_label = "Move Captures Beside .blend"

    @classmethod
    def blocked(cls, context):
        if live.capture is not None:
            return "Wait for the capture to end"
        return "" if movable_capture(context.scene) is not None else "No capture of an unsaved file to move"

    def execute(self, context):
        try:
            target = move_capture(context.scene)
        except OSError as e:
            self.report({"ERROR"}, f"the capture stays where it is: {e}")
            return {"CANCELLED"}
        self.report({"INFO"}, f"moved the capture to {target}")
        return {"FINISHED"}


CLASSES = (SPLATWRIGHT_OT_capture, SPLATWRIGHT_OT_capture_cancel, SPLATWRIGHT_OT_send_views,
           SPLATWRIGHT_OT_move_captures)
register, unregister = bpy.utils.register_classes_factory(CLASSES)

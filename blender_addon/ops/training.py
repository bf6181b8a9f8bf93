"""Training: start (continuing from the session's model or over), pause, resume, stop."""
import bpy
from bpy.props import EnumProperty
from bpy.types import Operator

from ..core.errors import SplatwrightError
from ..scene import live
from ..scene.session import has_model, not_connected, set_status, training_runs, training_state
from .base import Guarded, button, start_training


class SPLATWRIGHT_OT_train_start(Guarded, Operator):
    """Train on the captured views with these settings; over a trained model, it asks whether to continue
    from that model or start over"""
    bl_idname = "splatwright.train_start"
    bl_label = "Start Training"

    start: EnumProperty(name="Trained Model", default="CONTINUE", items=[
        ("CONTINUE", "Continue From It", "Train on from the session's model (as far as its schedule goes), as its "
                                         "splat object shows it where it was edited in Blender"),
        ("OVER", "Start Over", "Train a new model with these settings; the old one is kept on disk until the "
                               "new one's first checkpoint")])

    @classmethod
    def blocked(cls, context):
        capture = live.capture
        if capture is not None and capture.backend is not None and not capture.session_opened:
            return "Wait for the capture's first training view"  # the backend's session is still the one before
        return not_connected() or training_runs() or \
            ("" if live.backend.status.get("views") else "Capture views first (or send the last capture)")

    def invoke(self, context, event):
        if not has_model():
            return self.execute(context)
        return context.window_manager.invoke_props_dialog(self)

    def draw(self, context):
        layout = self.layout
        status = live.backend.status
        layout.label(text=f"Session {status.get('session')} has a trained model (step {status.get('step', 0)}).")
        layout.prop(self, "start", expand=True)

    def execute(self, context):
        try:
            start_training(context, fresh=self.start == "OVER")
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        return {"FINISHED"}


def training_control(name: str, label: str, description: str, request: str, states: tuple, hint: str) -> type:
    """Pause, resume, stop: one request each, allowed in some training states."""
    return button(name, label, description,
                  blocked=lambda context: not_connected() or ("" if training_state() in states else hint),
                  run=lambda context: live.backend.call(request, lambda c: c.call(request), set_status))


SPLATWRIGHT_OT_train_pause = training_control(
    "train_pause", "Pause", "Pause training after the current step", "pause", ("training",),
    "Training is not running")


SPLATWRIGHT_OT_train_resume = training_control(
    "train_resume", "Resume", "Resume paused training, or continue stopped training from its checkpoint",
    "resume", ("paused", "stopped", "failed"), "Nothing paused or stopped to resume")


SPLATWRIGHT_OT_train_stop = training_control(
    "train_stop", "Stop Training", "Stop training and write a checkpoint", "stop", ("training", "paused"),
    "Training is not running")



CLASSES = (SPLATWRIGHT_OT_train_start, SPLATWRIGHT_OT_train_pause, SPLATWRIGHT_OT_train_resume,
           SPLATWRIGHT_OT_train_stop)
register, unregister = bpy.utils.register_classes_factory(CLASSES)

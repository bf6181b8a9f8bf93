"""Capture & Train: the sidebar's one main button. It starts the backend where none runs, captures the views (or
takes the COLMAP import's photos), sends them and starts training, each step as soon as the one before allows; a
timer takes the steps that wait on the backend, so Blender never waits."""
from __future__ import annotations

from dataclasses import dataclass

import bpy
from bpy.types import Operator

from ..scene import live
from ..scene.colmap import imported_model
from ..scene.session import capture_runs, training_runs
from .base import PHOTOS, Guarded, connect, send_views, start_training

TICK = 0.2  # seconds between the flow's checks
SENDING = ("connect", "open_session", "set_points", "add_view", "send_views", "send_photos")  # the replies it awaits


@dataclass
class Flow:
    """What Capture & Train still has to do: 'capture' (wait for it to end), 'send', 'train'."""
    stage: str
    capture: object = None  # the capture it waits for (None: the next one to end)
    session: str = ""  # the session training starts in once the backend has opened it

    def describe(self) -> str:
        b = live.backend
        if b.connection == "connecting":
            return "Starting the backend"
        return {"capture": "Capturing", "send": "Sending the views", "train": "Starting training"}[self.stage]


flow: Flow | None = None


def running_flow() -> str:
    """What Capture & Train is doing now, or ''."""
    return flow.describe() if flow is not None else ""


class SPLATWRIGHT_OT_capture_train(Guarded, Operator):
    """Capture the views (or take the imported photos), send them to the backend, starting it where none runs,
    and train a model on them with the scene's settings"""
    bl_idname = "splatwright.capture_train"
    bl_label = "Capture & Train"

    @classmethod
    def blocked(cls, context):
        if flow is not None:
            return f"{flow.describe()}…"
        if reason := capture_runs() or training_runs():
            return reason
        if live.backend.connection == "connected" and live.backend.in_flight:
            return "Wait for the backend's reply"
        if live.photos is not None:
            return "Wait for the photos' cameras (or cancel them)"
        if context.scene.splatwright.source == PHOTOS and imported_model(context) is None:
            return "Make cameras from photos or import COLMAP photos, then select their Empty"
        return ""

    def invoke(self, context, event):
        return self.run(context, "INVOKE_DEFAULT")

    def execute(self, context):
        return self.run(context, "EXEC_DEFAULT")

    def run(self, context, how: str):
        global flow
        if live.backend.connection not in ("connected", "connecting"):
            connect(context)
        if context.scene.splatwright.source == PHOTOS:
            flow = Flow("send")
            return {"FINISHED"}
        before = live.last_capture
        result = bpy.ops.splatwright.capture(how)
        if "CANCELLED" in result:
            return {"CANCELLED"}
        flow = Flow("capture", capture=live.capture)
        if live.capture is None and live.last_capture is not before:  # it ran to its end in this call
            flow.capture = live.last_capture
            after_capture(live.last_capture)
        return {"FINISHED"}


def after_capture(job) -> None:
    """The capture ended: train where it sent its views, else send them first; a cancelled one ends the flow."""
    global flow
    if job is None or job.cancelled or not job.writer.frames["train"]:
        flow = None
    elif job.backend is not None and job.session_opened:
        flow.stage, flow.session = "train", job.session
    else:
        flow.stage = "send"


def advance() -> float:
    """The timer: take the flow's next step once the backend allows it."""
    global flow
    if flow is None:
        return TICK
    b = live.backend
    if flow.stage == "capture":
        if live.capture is None:
            after_capture(flow.capture if live.last_capture is flow.capture else None)
        return TICK
    if b.connection == "connecting" or (b.connection == "connected" and any(b.in_flight[x] for x in SENDING)):
        return TICK
    if b.connection != "connected":  # it failed to start or was lost: its report says why
        flow = None
        return TICK
    context = bpy.context
    if flow.stage == "send":
        if reason := send_views(context):
            live.report("ERROR", f"Capture & Train: {reason}")
            flow = None
            return TICK
        flow.stage, flow.session = "train", ""
    elif flow.stage == "train":
        status = b.status
        flow, session = None, flow.session
        if not status.get("views") or (session and status.get("session") != session):
            live.report("ERROR", "Capture & Train: the backend has none of the views to train on")
        else:
            start_training(context, fresh=True)
        live.redraw()
    return TICK


CLASSES = (SPLATWRIGHT_OT_capture_train,)
_register_classes, _unregister_classes = bpy.utils.register_classes_factory(CLASSES)


def register():
    _register_classes()
    bpy.app.timers.register(advance, first_interval=TICK, persistent=True)


def unregister():
    global flow
    if bpy.app.timers.is_registered(advance):
        bpy.app.timers.unregister(advance)
    flow = None
    _unregister_classes()

"""Operators. Each returns at once: requests go to the backend worker thread and their results come back
through the live.poll timer. poll() explains itself through blocked(), which the panels show as hints."""
import sys
from pathlib import Path
from typing import Callable

import bpy
import numpy as np
from bpy.props import EnumProperty, StringProperty
from bpy.types import Context, Operator

from . import live
from .colors import display_pixels
from .capture import Capture
from .core import protocol
from .core.errors import SplatwrightError
from .core.points import POINTS_FILE, read_points
from .dataset import training_views
from .environment import Setup, blender_python
from .preferences import data_folder, prefs, sources
from .scene_io import camera_of, viewport_camera
from .training import training_fields

PREVIEW_IMAGE = "Splatwright Preview"
PREVIEW_MAX_SIDE = 512
SHOW_MODEL = "show_model"  # the job that opens a splat object's session and loads its model (scene_splats.py)


def training_state() -> str:
    return live.backend.status.get("state") or "idle"


def training_runs() -> str:
    """Why nothing may change the backend's model now (training runs or is paused), or ''."""
    return "Training is running; stop it first" if training_state() in protocol.RUNNING else ""


def capture_runs() -> str:
    """Why the backend may not open another session now (a capture sends its views to its own), or ''."""
    return "Wait for the capture to end (or cancel it)" if live.capture is not None else ""


def not_connected() -> str:
    """Why requests cannot be sent now, or ''."""
    b = live.backend
    return {"connected": "", "connecting": "Waiting for the backend to start",
            "lost": "The backend was lost; start it again"}.get(b.connection, "Start the backend first")


def set_status(status: dict) -> None:
    live.backend.status = status


class Guarded:
    @classmethod
    def blocked(cls, context) -> str:
        return ""

    @classmethod
    def poll(cls, context):
        reason = cls.blocked(context)
        if reason:
            cls.poll_message_set(reason)
        return not reason


def button(name: str, label: str, description: str, blocked: Callable[[Context], str],
           run: Callable[[Context], object]) -> type:
    """An operator that does one thing, run(context), when blocked(context) gives no reason against it (the
    reason is the button's hint): the shape of most of the sidebar's buttons."""
    def execute(self, context):
        run(context)
        return {"FINISHED"}
    return type(f"SPLATWRIGHT_OT_{name}", (Guarded, Operator), {
        "__doc__": description, "bl_idname": f"splatwright.{name}", "bl_label": label,
        "blocked": classmethod(lambda cls, context: blocked(context)), "execute": execute})


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


# ---- backend process ----

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


def connect(context) -> None:
    """Start or reach the backend; one that has no session open reopens the scene's (after a crash, say)."""
    live.backend.connect(prefs(context).connect_settings(), reopen=context.scene.splatwright.session)


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


# ---- capture ----

class SPLATWRIGHT_OT_capture(Guarded, Operator):
    """Render the views into a NeRF-synthetic dataset and send them to the backend as they finish. Each view
    renders as a Blender render job in the render window; Esc or Cancel Capture stops it"""
    bl_idname = "splatwright.capture"
    bl_label = "Capture Views"

    @classmethod
    def blocked(cls, context):
        if live.capture is not None:
            return "A capture is running (Esc or Cancel Capture stops it)"
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


def cannot_send() -> str:
    """Why views cannot be sent to the backend now, or ''."""
    if reason := not_connected():
        return reason
    return "Wait for the capture or training to end" if live.capture is not None or \
        training_state() in protocol.RUNNING else ""


class SPLATWRIGHT_OT_send_views(Guarded, Operator):
    """Send the last capture's training views (and its initial points) to the backend, e.g. after capturing
    while no backend ran; views the backend already has are not sent again"""
    bl_idname = "splatwright.send_views"
    bl_label = "Send Views"

    @classmethod
    def blocked(cls, context):
        return cannot_send() or ("" if context.scene.splatwright.capture_folder else "Capture views first")

    def execute(self, context):
        s = context.scene.splatwright
        folder = Path(s.capture_folder)
        try:
            views = training_views(folder)
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        points = folder / POINTS_FILE
        send_to_session(context, "send_views", folder.name,  # a capture's session is named after its folder
                        views, points if points.is_file() else None, "views")
        return {"FINISHED"}


def send_to_session(context, request: str, name: str, views: list, points, what: str) -> None:
    """On the worker: open session `name`, send the `views` (name, camera, image, time) it does not have yet
    and the initial `points`; the session becomes the scene's. An image is a frame or a file's bytes, or the
    path of a PNG, which is read there; a time is a dynamic scene's (or None); `points` is (xyz, rgb), the path
    of a points file, or None."""
    s = context.scene.splatwright

    def send(client):
        missing = views[client.call("open_session", name=name)["views"]:]
        for view_name, cam, image, time in missing:
            client.add_view(cam, image.read_bytes() if isinstance(image, Path) else image, view_name, time)
        if points is not None:
            client.set_points(*(read_points(points) if isinstance(points, Path) else points))
        return len(missing), client.call("status")

    def sent(result) -> str:
        count, status = result
        s.session = name
        set_status(status)
        return f"sent {count} {what} to session {name} ({status['views']} in all)"
    live.backend.call(request, send, sent)


# ---- training ----

def has_model() -> bool:
    """The session has a model: trained, in the backend or as its checkpoint, or the file an import made it
    from (such a session has no views to train on)."""
    status = live.backend.status
    return bool(status.get("step") or status.get("checkpoint"))


class SPLATWRIGHT_OT_train_start(Guarded, Operator):
    """Train on the captured views with these settings; over a trained model, it asks whether to continue
    from that model or start over"""
    bl_idname = "splatwright.train_start"
    bl_label = "Start Training"

    start: EnumProperty(name="Trained Model", default="CONTINUE", items=[
        ("CONTINUE", "Continue From It", "Train on from the session's model (as far as its schedule goes)"),
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
        fields = training_fields(context.scene.splatwright, fresh=self.start == "OVER")
        live.backend.progress = {}
        live.backend.call("start_training", lambda c: c.call("start_training", **fields), started)
        return {"FINISHED"}


def started(reply: dict) -> str:
    status = {k: v for k, v in reply.items() if k != "continued"}
    set_status(status)
    how = f"continues from step {status['step']}" if reply["continued"] else "starts from scratch"
    return f"training {how} in session {status['session']}"


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


# ---- view and export ----

def nothing_to_show() -> str:
    """Why no model can be viewed or exported now, or ''."""
    if reason := not_connected():
        return reason
    if live.backend.status.get("gaussians"):
        return ""
    if SHOW_MODEL in live.backend.in_flight:  # its session is open, its saved model not loaded yet
        return "Wait for Show Model to load the model"
    return "Train or load a PLY first"


class NeedsModel(Guarded):
    """An operator on the backend's model: allowed once there is one."""
    @classmethod
    def blocked(cls, context):
        return nothing_to_show()


class SPLATWRIGHT_OT_render_preview(NeedsModel, Operator):
    """Render the model from the 3D viewport (or the scene camera) into the image 'Splatwright Preview'"""
    bl_idname = "splatwright.render_preview"
    bl_label = "Render Preview"

    def execute(self, context):
        scene = context.scene
        try:
            cam = viewport_camera(context) or (camera_of(scene.camera, scene) if scene.camera else None)
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        if cam is None:
            self.report({"ERROR"}, "no 3D viewport or scene camera to render from")
            return {"CANCELLED"}
        cam = cam.scaled(min(1.0, PREVIEW_MAX_SIDE / max(cam.width, cam.height)))
        live.backend.call("render", lambda c: c.render(cam), show_preview)
        return {"FINISHED"}


def show_preview(rgba: np.ndarray) -> str:
    """Put a bottom-up RGBA8 frame into the preview image (bottom-up too, as Blender stores pixels)."""
    h, w = rgba.shape[:2]
    image = bpy.data.images.get(PREVIEW_IMAGE) or bpy.data.images.new(PREVIEW_IMAGE, w, h, alpha=True)
    if tuple(image.size) != (w, h):
        image.scale(w, h)
    image.pixels.foreach_set(display_pixels(rgba))  # a byte image holds the sRGB-encoded values
    image.update()
    return ""


CLASSES = (SPLATWRIGHT_OT_report, SPLATWRIGHT_OT_setup_backend, SPLATWRIGHT_OT_setup_cancel,
           SPLATWRIGHT_OT_backend_start, SPLATWRIGHT_OT_backend_check, SPLATWRIGHT_OT_backend_stop,
           SPLATWRIGHT_OT_backend_kill,
           SPLATWRIGHT_OT_capture, SPLATWRIGHT_OT_capture_cancel, SPLATWRIGHT_OT_send_views,
           SPLATWRIGHT_OT_train_start, SPLATWRIGHT_OT_train_pause,
           SPLATWRIGHT_OT_train_resume, SPLATWRIGHT_OT_train_stop, SPLATWRIGHT_OT_render_preview)
register, unregister = bpy.utils.register_classes_factory(CLASSES)

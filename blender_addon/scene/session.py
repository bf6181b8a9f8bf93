"""The backend's open session as the add-on sees it: why a request may not be sent now (the operators' hints),
and sending views to it. Each query reads the live state only, so it is as cheap as a panel's redraw needs."""
from __future__ import annotations

from pathlib import Path

from ..core import protocol
from ..core.points import read_points
from . import live

SHOW_MODEL = "show_model"  # the job that opens a splat object's session and loads its model (ops/splats.py)


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


def cannot_send() -> str:
    """Why views cannot be sent to the backend now, or ''."""
    if reason := not_connected():
        return reason
    return "Wait for the capture or training to end" if live.capture is not None or \
        training_state() in protocol.RUNNING else ""


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


def has_model() -> bool:
    """The session has a model: trained, in the backend or as its checkpoint, or the file an import made it
    from (such a session has no views to train on)."""
    status = live.backend.status
    return bool(status.get("step") or status.get("checkpoint"))


def nothing_to_show() -> str:
    """Why no model can be viewed or exported now, or ''."""
    if reason := not_connected():
        return reason
    if live.backend.status.get("gaussians"):
        return ""
    if SHOW_MODEL in live.backend.in_flight:  # its session is open, its saved model not loaded yet
        return "Wait for Show Model to load the model"
    return "Train or load a PLY first"


"""The add-on's live state: the backend link, the environment setup job and the running capture, plus the
bpy.app.timers poller that applies their news on the main thread."""
from __future__ import annotations

import atexit
import traceback

import bpy

from .runtime import Backend, Setup

backend: Backend | None = None
setup: Setup | None = None
capture = None  # the capture.Capture a modal operator is running, if any

BUSY_INTERVAL = 0.1  # seconds between polls while something is happening
IDLE_INTERVAL = 0.5
REDRAW_AREAS = {"VIEW_3D", "PREFERENCES", "IMAGE_EDITOR"}


def poll() -> float:
    """The timer: apply what the worker threads posted, report errors, redraw. Never blocks."""
    setup_running = setup is not None and setup.returncode is None
    try:
        changed, reports = backend.drain()
        for level, message in reports:
            bpy.ops.splatwright.report(level=level, message=message)
        if changed or setup_running:
            redraw()
    except Exception:  # a bug: keep the timer alive, show it in the console
        traceback.print_exc()
    busy = backend.in_flight or backend.status.get("state") == "training" or backend.connection == "connecting"
    return BUSY_INTERVAL if busy or setup_running else IDLE_INTERVAL


def redraw(area_types=REDRAW_AREAS) -> None:
    for window in bpy.context.window_manager.windows:
        for area in window.screen.areas:
            if area.type in area_types:
                area.tag_redraw()


def _shutdown() -> None:
    if backend is not None:
        backend.close()


def register():
    global backend
    backend = Backend()
    bpy.app.timers.register(poll, first_interval=IDLE_INTERVAL, persistent=True)
    atexit.register(_shutdown)


def unregister():
    global backend, setup, capture
    if bpy.app.timers.is_registered(poll):
        bpy.app.timers.unregister(poll)
    atexit.unregister(_shutdown)
    _shutdown()
    backend = setup = capture = None

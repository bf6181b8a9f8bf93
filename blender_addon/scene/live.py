"""The add-on's live state: the backend link, the environment setup job and the running capture, plus the
bpy.app.timers poller that applies their news on the main thread."""
from __future__ import annotations

import atexit
import traceback

import bpy

from ..logic.environment import Setup
from ..logic.messages import one_line
from ..logic.runtime import Backend

backend: Backend | None = None
setup: Setup | None = None
capture = None  # the capture.Capture a modal operator is running, if any
last_capture = None  # the capture.Capture that ended last (Capture & Train goes on from it)
photos = None  # the logic/reconstruction.Reconstruction of photos into cameras running, if any

BUSY_INTERVAL = 0.1  # seconds between polls while something is happening
IDLE_INTERVAL = 0.5
REDRAW_AREAS = {"VIEW_3D", "PREFERENCES", "IMAGE_EDITOR"}


def poll() -> float:
    """The timer: apply what the worker threads posted, report errors, redraw. Never blocks."""
    setup_running = setup is not None and setup.returncode is None
    try:
        changed, reports = backend.drain()
        for level, message in reports:
            report(level, message)
        if changed or setup_running:
            redraw()
    except Exception:  # a bug: keep the timer alive, show it in the console
        traceback.print_exc()
    busy = backend.in_flight or backend.status.get("state") == "training" or backend.connection == "connecting"
    return BUSY_INTERVAL if busy or setup_running else IDLE_INTERVAL


def report(level: str, message: str) -> None:
    """Put a message into Blender's reports (the status bar and the Info log) from a timer, as one line.

    An operator's reports reach them only from Blender's event loop: called from a script, they are printed
    to stdout and dropped (and an ERROR raises RuntimeError). So with a window the report operator is
    invoked there and reports from its modal handler, on the next event; without one (blender -b, the bpy
    module) nothing shows reports, so it reports where Blender prints them."""
    window = next(iter(bpy.context.window_manager.windows), None)
    if window is None or bpy.app.background:
        try:
            bpy.ops.splatwright.report(level=level, message=one_line(message))
        except RuntimeError:
            pass  # what an ERROR report raises; it is printed already
        return
    with bpy.context.temp_override(window=window):
        bpy.ops.splatwright.report("INVOKE_DEFAULT", level=level, message=one_line(message))


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
    global backend, setup, capture, last_capture, photos
    if bpy.app.timers.is_registered(poll):
        bpy.app.timers.unregister(poll)
    atexit.unregister(_shutdown)
    _shutdown()
    backend = setup = capture = last_capture = photos = None

"""Progress in Blender's status bar, where Blender's own jobs show theirs: the running capture's views, the
training's steps with the time left, and the photos being made into cameras, drawn beside Blender's job progress
(STATUSBAR_HT_header)."""
from __future__ import annotations

import time

import bpy

from ..ops.colmap import reconstruction_progress
from ..ops.flow import running_flow
from ..scene import live
from .kit import duration

shown: list[str] = []  # the text last drawn, for the window tests


def status_text() -> tuple[float | None, str]:
    """(the share done, or None, and the text) of what runs now; (None, '') where nothing does."""
    job = live.capture
    if job is not None:
        left = job.seconds_left()
        return job.done / job.total, f"Capture {job.done}/{job.total}" + (f", {duration(left)} left" if left else "")
    b = live.backend
    if b is None:
        return None, ""
    state, step, total = b.status.get("state"), b.status.get("step", 0), b.status.get("iterations", 0)
    if state in ("training", "paused") and total:
        left = b.clock.remaining(time.monotonic()) if state == "training" else None
        what = "Training" if state == "training" else "Paused"
        return min(1.0, step / total), f"{what} {step}/{total}" + (f", {duration(left)} left" if left is not None
                                                                  else "")
    factor, text = reconstruction_progress()
    if text:
        return factor, f"Photos: {text}"
    if doing := running_flow():
        return None, f"Splatwright: {doing}"
    return None, ""


def draw(self, context) -> None:
    factor, text = status_text()
    if not text:
        return
    shown[:] = [text]
    row = self.layout.row(align=True)
    if factor is None:
        row.label(text=text, icon="TIME")
    elif bpy.app.version >= (4, 0, 0):
        row.progress(factor=factor, type="BAR", text=text)
    else:
        row.label(text=f"{text} ({100 * factor:.0f}%)", icon="TIME")


def redraw_status_bar() -> float:
    """Timer: the status bar redraws itself rarely; while something runs, ask it to every second."""
    if status_text()[1]:
        for window in bpy.context.window_manager.windows:
            for area in window.screen.areas:
                if area.type == "STATUSBAR":
                    area.tag_redraw()
    return 1.0


def register():
    bpy.types.STATUSBAR_HT_header.append(draw)
    bpy.app.timers.register(redraw_status_bar, first_interval=1.0, persistent=True)


def unregister():
    if bpy.app.timers.is_registered(redraw_status_bar):
        bpy.app.timers.unregister(redraw_status_bar)
    bpy.types.STATUSBAR_HT_header.remove(draw)

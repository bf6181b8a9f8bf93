"""The Splatwright render engine. With viewport shading Rendered it shows the model live from the viewport's
camera; F12, animation renders and `blender -b file.blend -a` render it through the scene camera with a
Depth pass. The backend draws every pixel; this module asks for frames and puts them on screen or into the
render result."""
from __future__ import annotations

import time
import weakref
from collections import deque

import blf
import bpy
import gpu
import numpy as np
from gpu_extras.presets import draw_texture_2d

from . import live
from .core.cameras import Camera
from .colors import combined_pass
from .core.client import RemoteError, decode_depth, decode_frame, wait_done
from .core.errors import SplatwrightError
from .frames import CPU_TRAINING_SCALE, border_rect, training_frame_gap
from .operators import nothing_to_show
from .preferences import prefs
from .scene_io import camera_of, region_camera

MOVING_SCALE = 0.5  # frame size while the view moves
REST_SECONDS = 0.2  # a view that stayed put this long gets full-size frames
WATCH_INTERVAL = 0.01  # seconds between checks for a frame to show
RENDER_TIMEOUT = 600.0
MESSAGE_COLOR = (1.0, 1.0, 1.0, 1.0)

# Main-thread seconds of each viewport redraw and of each frame upload in it, newest last (tests read them).
draw_seconds: deque[float] = deque(maxlen=500)
upload_seconds: deque[float] = deque(maxlen=500)
_views: weakref.WeakSet = weakref.WeakSet()  # the LiveView of every viewport in Rendered shading


class LiveView:
    """One viewport's frames: what was asked for, the newest frame as a GPU texture."""

    def __init__(self):
        self.stream = live.backend.frame_stream()
        self.view_key = None  # the camera of the view as last drawn
        self.moved_at = 0.0
        self.asked = None  # (view key, scale, backend revision) of the newest request
        self.asked_at = 0.0
        self.first_asked_at: float | None = None
        self.rest_scale = 1.0  # the size a resting view gets
        self.held_until: float | None = None  # when a request held back on a training CPU backend is due
        self.texture = None
        self.texture_seq = 0
        self.shown_wait = -1  # the whole seconds of waiting the view shows

    def update(self, cam: Camera) -> None:
        """Ask for a frame when the view, the wanted size or the model changed since the last request (on a
        training CPU backend: only when the view rests and the backend had its time to train)."""
        now = time.monotonic()
        key = (cam.c2w.tobytes(), cam.K.tobytes(), cam.width, cam.height)
        if key != self.view_key:
            self.view_key, self.moved_at = key, now
        rested_at = self.moved_at + REST_SECONDS
        self.rest_scale = CPU_TRAINING_SCALE if training_on_cpu() else 1.0
        if self.rest_scale < 1.0:
            scale, due = self.rest_scale, max(rested_at, self.asked_at + self.frame_gap())  # frames.py says why
        else:
            scale, due = (1.0 if now >= rested_at else MOVING_SCALE), now
        want = (key, scale, live.backend.revision)
        if want == self.asked:
            self.held_until = None
            return
        if now < due and self.first_asked_at is not None:
            self.held_until = due
        else:
            self.asked, self.asked_at, self.held_until = want, now, None
            self.first_asked_at = self.first_asked_at or now
            self.stream.ask(cam.scaled(scale), tag=want)
        if not bpy.app.timers.is_registered(_watch):  # it stops when no view waits for anything
            bpy.app.timers.register(_watch, first_interval=WATCH_INTERVAL)

    def frame_gap(self) -> float:
        frame = self.stream.frame
        return training_frame_gap(frame.seconds if frame is not None else 0.0)

    def stale(self) -> bool:
        """The view should be drawn again: a newer frame waits to be shown, the view has rested long enough for
        a full-size one, a held-back request is due, or the wait for the first frame is a second longer."""
        now = time.monotonic()
        frame = self.stream.frame
        if frame is not None and frame.seq != self.texture_seq:
            return True
        if self.held_until is not None and now >= self.held_until:
            return True
        if frame is None and self.first_asked_at is not None and int(now - self.first_asked_at) != self.shown_wait:
            return True
        return self.asked is not None and self.asked[1] < self.rest_scale and now - self.moved_at >= REST_SECONDS

    def waiting(self) -> bool:
        """A request is not answered yet or held back, or a full-size frame is still to come once the view
        rests."""
        if self.asked is None:
            return False
        frame = self.stream.frame
        return (frame is None or frame.tag != self.asked or self.held_until is not None
                or self.asked[1] < self.rest_scale)

    def waiting_note(self) -> str:
        """What to show while the first frame is on its way, or ''."""
        if self.stream.frame is not None or self.first_asked_at is None:
            return ""
        self.shown_wait = int(time.monotonic() - self.first_asked_at)
        return f"Splatwright: waiting for the first frame\u2026 {self.shown_wait} s"

    def texture_of_newest(self):
        """The newest frame as a texture, uploaded here when it is new: the stream's thread already made
        the float buffer, so this is one copy."""
        frame = self.stream.frame
        if frame is not None and frame.seq != self.texture_seq:
            start = time.perf_counter()
            self.texture = frame_texture(frame.pixels, frame.fields["width"], frame.fields["height"])
            self.texture_seq = frame.seq
            upload_seconds.append(time.perf_counter() - start)
        return self.texture

    def close(self) -> None:
        self.stream.close()


def training_on_cpu() -> bool:
    b = live.backend
    return b.capabilities.get("device") == "cpu" and b.status.get("state") == "training"


def frame_texture(pixels: np.ndarray, width: int, height: int):
    """A GPU texture of a frame's sRGB-encoded float buffer (client.display_pixels). The sRGB texture format
    makes the GPU decode to the scene-linear values the viewport expects when it samples, so the CPU does
    no per-pixel colour conversion. (Blender's GPUTexture takes FLOAT buffers only.)"""
    buffer = gpu.types.Buffer("FLOAT", len(pixels), pixels)
    return gpu.types.GPUTexture((width, height), format="SRGB8_A8", data=buffer)


def _watch() -> float | None:
    """Timer: redraw the viewports when a frame arrived or a resting view is due a full-size one. It ends
    when no view waits for anything; LiveView.update starts it again with its next request."""
    views = list(_views)
    stale = [view.stale() for view in views]
    if any(stale):
        live.redraw({"VIEW_3D"})  # frames are shown only there
    return WATCH_INTERVAL if any(stale) or any(view.waiting() for view in views) else None


def draw_message(region, text: str) -> None:
    size = 14 * bpy.context.preferences.system.ui_scale
    blf.size(0, size)
    blf.color(0, *MESSAGE_COLOR)
    blf.position(0, 20, region.height - 40, 0)
    blf.draw(0, text)


class SPLATWRIGHT_RE_engine(bpy.types.RenderEngine):
    bl_idname = "SPLATWRIGHT"
    bl_label = "Splatwright"
    bl_use_preview = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.view: LiveView | None = None

    def __del__(self):
        try:
            self.close_view()
        except (AttributeError, ReferenceError):  # never set, or Blender 3.x already freed the engine's data
            pass

    def close_view(self) -> None:
        """Stop this viewport's frames (and the redraws waiting for them) until it can show the model again."""
        if self.view is not None:
            self.view.close()
            _views.discard(self.view)
            self.view = None

    # ---- viewport ----

    def view_update(self, context, depsgraph):
        pass  # Blender uses an engine in the viewport only if it has both view_update and view_draw

    def view_draw(self, context, depsgraph):
        start = time.perf_counter()
        self.draw_view(context)
        draw_seconds.append(time.perf_counter() - start)

    def draw_view(self, context) -> None:
        region = context.region
        try:
            cam = region_camera(region, context.region_data)
        except SplatwrightError as e:
            self.close_view()
            draw_message(region, "Splatwright: " + str(e).split(";")[0] + " (numpad 5 for perspective)")
            return
        reason = nothing_to_show()
        if reason:
            self.close_view()
            draw_message(region, f"Splatwright: {reason}")
            return
        if self.view is None:
            self.view = LiveView()
            _views.add(self.view)
        self.view.update(cam)
        texture = self.view.texture_of_newest()
        if texture is not None:
            gpu.state.blend_set("NONE")  # the frame is already composited over the session's background
            draw_texture_2d(texture, (0, 0), region.width, region.height)
        if self.view.stream.error:
            draw_message(region, f"Splatwright: {self.view.stream.error}")
        elif texture is None:
            draw_message(region, self.view.waiting_note())

    # ---- final renders ----

    def update_render_passes(self, scene=None, renderlayer=None):
        self.register_pass(scene, renderlayer, "Combined", 4, "RGBA", "COLOR")
        if renderlayer.use_pass_z:
            self.register_pass(scene, renderlayer, "Depth", 1, "Z", "VALUE")

    def render(self, depsgraph):
        scene = depsgraph.scene
        try:
            reply = self.fetch(scene)
        except InterruptedError:
            return
        except (SplatwrightError, RemoteError, TimeoutError, OSError) as e:
            self.report({"ERROR"}, f"Splatwright: {e}")
            return
        width, height = reply.fields["width"], reply.fields["height"]
        result = self.begin_result(0, 0, width, height)
        layer = result.layers[0]
        combined = combined_pass(decode_frame(reply), reply.fields["background"], scene.render.film_transparent)
        set_pass(layer.passes["Combined"], combined)
        depth = layer.passes.get("Depth")
        if depth is not None:
            set_pass(depth, decode_depth(reply).ravel())
        self.end_result(result)

    def fetch(self, scene):
        """The backend's frame and depth of the scene camera at the output size, or of its render border."""
        if scene.camera is None:
            raise SplatwrightError("the scene has no camera to render through")
        cam = camera_of(scene.camera, scene)
        x, y, width, height = border_rect(scene.render, cam.width, cam.height)
        cam = cam.cropped(x, cam.height - y - height, width, height)  # Blender counts rows from the bottom
        backend, session = live.backend, scene.splatwright.session
        if bpy.app.background and backend.connection == "disconnected":  # nobody pressed Start: -b -a
            backend.connect(prefs(bpy.context).connect_settings())

        def submit(client):  # on the worker, which the render then no longer holds up
            if not client.call("status")["gaussians"] and session:  # a fresh backend: show the scene's session
                client.call("open_session", name=session, create=False)
                client.call("load_checkpoint")
            return client.submit_render(cam, depth=True)
        self.update_stats("Splatwright", f"rendering {cam.width}x{cam.height} on the backend")
        pending = backend.wait("render", submit, RENDER_TIMEOUT, self.test_break)
        return wait_done(pending, "render", RENDER_TIMEOUT, self.test_break)


def set_pass(render_pass, values: np.ndarray) -> None:
    """Fill a render pass (values: one flat float32 array). Blender 4.5 takes it as it is; Blender 3.4 wants a
    row per pixel (and both report len(rect) as the pixel count, so only trying tells them apart)."""
    rect = render_pass.rect
    try:
        rect.foreach_set(values)
    except TypeError:
        rect.foreach_set(values.reshape(len(rect), -1))


def compatible_panels():
    """The built-in panels shown for Blender's own engines that make sense here (output size, format, passes)."""
    return [panel for panel in bpy.types.Panel.__subclasses__()
            if "BLENDER_RENDER" in getattr(panel, "COMPAT_ENGINES", ())]


def register():
    bpy.utils.register_class(SPLATWRIGHT_RE_engine)
    for panel in compatible_panels():
        panel.COMPAT_ENGINES.add(SPLATWRIGHT_RE_engine.bl_idname)


def unregister():
    for panel in compatible_panels():
        panel.COMPAT_ENGINES.discard(SPLATWRIGHT_RE_engine.bl_idname)
    if bpy.app.timers.is_registered(_watch):
        bpy.app.timers.unregister(_watch)
    for view in list(_views):
        view.close()
    bpy.utils.unregister_class(SPLATWRIGHT_RE_engine)

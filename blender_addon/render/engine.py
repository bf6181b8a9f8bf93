"""The Splatwright render engine. With viewport shading Rendered it shows the model live from the viewport's
camera; F12, animation renders and `blender -b file.blend -a` render it through the scene camera with a
Depth pass. Where a splat object of the shown session places the model in the scene (splats.py), both
see it through the camera taken into the model's space and cropped by its crop box, as the other engines'
composites do. The backend draws
every pixel; this module asks for frames and puts them on screen or into the render result."""
from __future__ import annotations

import time
import weakref
from collections import deque
from typing import Callable

import blf
import bpy
import gpu
import numpy as np
from gpu_extras.batch import batch_for_shader

from ..core.cameras import Camera
from ..core.client import RemoteError, decode_depth, decode_frame, wait_done
from ..core.errors import SplatwrightError
from ..logic.colors import combined_pass
from ..logic.frames import CPU_TRAINING_SCALE, border_rect, training_frame_gap
from ..logic.placement import scene_depths
from ..logic.view_transform import ENCODING_OFFSET, ENCODING_STOPS, Inverse, grey_ends
from ..scene import live, splats
from ..scene.addon import prefs
from ..scene.reading import camera_of, region_camera
from ..scene.session import nothing_to_show
from . import view_colors

MOVING_SCALE = 0.5  # frame size while the view moves
REST_SECONDS = 0.2  # a view that stayed put this long gets full-size frames
WATCH_INTERVAL = 0.01  # seconds between checks for a frame to show
RENDER_TIMEOUT = 600.0
MESSAGE_COLOR = (1.0, 1.0, 1.0, 1.0)
SRGB_TEXTURE, DISPLAY_TEXTURE = "SRGB8_A8", "RGBA8"  # a frame's texture, with or without the view's inverse

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
        self.shows = (None, None, None)  # the model, crop and time of the frames asked for
        self.asked = None  # (view key, scale, backend revision, shows) of the newest request
        self.asked_at = 0.0
        self.first_asked_at: float | None = None
        self.rest_scale = 1.0  # the size a resting view gets
        self.held_until: float | None = None  # when a request held back on a training CPU backend is due
        self.texture = None
        self.texture_seq = 0
        self.texture_format = ""
        self.shown_key = None  # the view key of the inverse the view was last drawn through, or None
        self.shown_wait = -1  # the whole seconds of waiting the view shows

    def update(self, cam: Camera, choice: dict | None = None) -> None:
        """Ask for a frame of `choice` (splats.model_choice; None: the model the backend shows) when the
        view, the wanted size, the model, its crop or the time changed since the last request (on a training
        CPU backend: only when the view rests and the backend had its time to train)."""
        choice = choice or {}
        crop = choice.get("crop")
        shows = (choice.get("model"), None if crop is None else crop.tobytes(), choice.get("time"))
        if shows != self.shows:  # a frame of the old crop or time would pass for one of the new
            self.stream.model_choice, self.shows = choice, shows
        now = time.monotonic()
        key = (cam.c2w.tobytes(), cam.K.tobytes(), cam.width, cam.height)
        if key != self.view_key:
            self.view_key, self.moved_at = key, now
        rested_at = self.moved_at + REST_SECONDS
        self.rest_scale = CPU_TRAINING_SCALE if training_on_cpu() else 1.0
        if self.rest_scale < 1.0:
            scale, due = self.rest_scale, max(rested_at, self.asked_at + self.frame_gap())  # logic/frames.py says why
        else:
            scale, due = (1.0 if now >= rested_at else MOVING_SCALE), now
        want = (key, scale, live.backend.revision, self.shows)
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
        if self.frame_to_show():
            return True
        if self.held_until is not None and now >= self.held_until:
            return True
        if frame is None and self.first_asked_at is not None and int(now - self.first_asked_at) != self.shown_wait:
            return True
        return self.asked is not None and self.asked[1] < self.rest_scale and now - self.moved_at >= REST_SECONDS

    def frame_to_show(self) -> bool:
        """A frame arrived that the view has not drawn yet."""
        frame = self.stream.frame
        return frame is not None and frame.seq != self.texture_seq and self.of_this_time(frame)

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

    def of_this_time(self, frame) -> bool:
        """Whether `frame` shows the model at the time asked for now: a 4D model's frames of another time are
        never shown; a static model's frame is of every time (so a frame change does not hide it)."""
        return not frame.fields["dynamic"] or frame.tag[3][2] == self.shows[2]  # its tag: its request's `asked`

    def texture_of_newest(self, texture_format: str):
        """The newest frame as a texture of that format, uploaded here when it is new (the stream's thread
        already made the float buffer, so this is one copy); None while it is of another time."""
        frame = self.stream.frame
        if frame is None or not self.of_this_time(frame):
            return None
        if (frame.seq, texture_format) != (self.texture_seq, self.texture_format):
            start = time.perf_counter()
            self.texture = frame_texture(frame.pixels, frame.fields["width"], frame.fields["height"], texture_format)
            self.texture_seq, self.texture_format = frame.seq, texture_format
            upload_seconds.append(time.perf_counter() - start)
        return self.texture

    def close(self) -> None:
        self.stream.close()


def training_on_cpu() -> bool:
    b = live.backend
    return b.capabilities.get("device") == "cpu" and b.status.get("state") == "training"


def frame_texture(pixels: np.ndarray, width: int, height: int, texture_format: str = SRGB_TEXTURE):
    """A GPU texture of a frame's sRGB-encoded float buffer (colors.display_pixels). SRGB_TEXTURE makes the
    GPU decode to the scene-linear values the Standard view transform shows as they were, so the CPU does no
    per-pixel colour conversion; DISPLAY_TEXTURE keeps the display values, for the inverse of another view
    transform. (Blender's GPUTexture takes FLOAT buffers only.)"""
    buffer = gpu.types.Buffer("FLOAT", len(pixels), pixels)
    return gpu.types.GPUTexture((width, height), format=texture_format, data=buffer)


class FrameDrawing:
    """Covers the region with a frame, opaque: the frame is composited over the session's background
    already, and the viewport would blend what alpha it has over the world's colour. A SRGB_TEXTURE shows as
    the GPU decodes it; a DISPLAY_TEXTURE goes through the inverse of the scene's view transform
    (view_transform.Inverse: its table as a 3D texture, its shaper as a row texture). Made in a redraw,
    where the GPU module works."""

    def __init__(self):
        self.decoded = self._shader(("frame",), (), DECODED_FRAGMENT)
        self.through_inverse = self._shader(("frame", "table", "shaper"), ("darkest", "brightest"), INVERSE_FRAGMENT)
        self.inverse: Inverse | None = None  # the one whose textures these are
        self.inverse_textures = {}

    @staticmethod
    def _shader(samplers, vectors, fragment: str):
        interface = gpu.types.GPUStageInterfaceInfo("splatwright_frame_interface")
        interface.smooth("VEC2", "uv")
        info = gpu.types.GPUShaderCreateInfo()
        info.vertex_in(0, "VEC2", "position")
        info.vertex_out(interface)
        for slot, name in enumerate(samplers):
            info.sampler(slot, "FLOAT_3D" if name == "table" else "FLOAT_2D", name)
        for name in vectors:
            info.push_constant("VEC3", name)
        info.fragment_out(0, "VEC4", "color")
        info.vertex_source(FRAME_VERTEX)
        info.fragment_source(fragment)
        shader = gpu.shader.create_from_info(info)
        return shader, batch_for_shader(shader, "TRI_FAN", {"position": ((-1, -1), (1, -1), (1, 1), (-1, 1))})

    def draw(self, frame, inverse: Inverse | None) -> None:
        """`frame`: a SRGB_TEXTURE without an inverse, a DISPLAY_TEXTURE with one."""
        shader, batch = self.decoded if inverse is None else self.through_inverse
        shader.bind()
        shader.uniform_sampler("frame", frame)
        if inverse is not None:
            if inverse is not self.inverse:
                self.inverse_textures, self.inverse = inverse_textures(inverse), inverse
            for name, texture in self.inverse_textures.items():
                shader.uniform_sampler(name, texture)
            for name, value in zip(("darkest", "brightest"), grey_ends(inverse.forward)):
                shader.uniform_float(name, tuple(float(v) for v in value))
        batch.draw(shader)


def inverse_textures(inverse: Inverse) -> dict:
    table = np.zeros(inverse.table.shape[:3] + (4,), np.float32)
    table[..., :3] = inverse.table.transpose(2, 1, 0, 3)  # red varies fastest, along the texture's x
    shaper = np.zeros((len(inverse.shaper), 4), np.float32)
    shaper[:, :3] = inverse.shaper
    return {"table": gpu.types.GPUTexture(table.shape[:3], format="RGBA32F",
                                          data=gpu.types.Buffer("FLOAT", table.size, table.reshape(-1))),
            "shaper": gpu.types.GPUTexture((len(shaper), 1), format="RGBA32F",
                                           data=gpu.types.Buffer("FLOAT", shaper.size, shaper.reshape(-1)))}


FRAME_VERTEX = """
void main()
{
  uv = position * 0.5 + 0.5;
  gl_Position = vec4(position, 0.0, 1.0);
}
"""
DECODED_FRAGMENT = """
void main()
{
  color = vec4(texture(frame, uv).rgb, 1.0);
}
"""
# view_transform.Inverse.__call__ on the GPU: the table (over the grey range) trilinearly, each channel's shaper
# linearly, decode.
INVERSE_FRAGMENT = """
vec3 table_at(ivec3 i, ivec3 corner) { return texelFetch(table, i + corner, 0).rgb; }
float shaper_at(int i, int channel) { return texelFetch(shaper, ivec2(i, 0), 0)[channel]; }

void main()
{
  vec3 display = texture(frame, uv).rgb;
  int n = textureSize(table, 0).x - 1;
  vec3 q = clamp((display - darkest) / max(brightest - darkest, vec3(1e-6)), 0.0, 1.0) * float(n);
  ivec3 i = min(ivec3(q), ivec3(n - 1));
  vec3 t = q - vec3(i);
  vec3 s = mix(mix(mix(table_at(i, ivec3(0, 0, 0)), table_at(i, ivec3(1, 0, 0)), t.x),
                   mix(table_at(i, ivec3(0, 1, 0)), table_at(i, ivec3(1, 1, 0)), t.x), t.y),
               mix(mix(table_at(i, ivec3(0, 0, 1)), table_at(i, ivec3(1, 0, 1)), t.x),
                   mix(table_at(i, ivec3(0, 1, 1)), table_at(i, ivec3(1, 1, 1)), t.x), t.y), t.z);
  int m = textureSize(shaper, 0).x - 1;
  vec3 p = clamp(s, 0.0, 1.0) * float(m);
  ivec3 j = min(ivec3(p), ivec3(m - 1));
  vec3 f = p - vec3(j);
  vec3 u;
  for (int c = 0; c < 3; c++) {
    u[c] = mix(shaper_at(j[c], c), shaper_at(j[c] + 1, c), f[c]);
  }
  color = vec4((exp2(STOPS * u) - 1.0) / OFFSET, 1.0);
}
""".replace("STOPS", f"{ENCODING_STOPS:.1f}").replace("OFFSET", f"{ENCODING_OFFSET:.1f}")
_frame_drawing: FrameDrawing | None = None


def drawn_inverse(scene) -> tuple[tuple | None, Inverse | None, str]:
    """The view key of the scene's colour management, the inverse the viewport draws through (None where
    Standard needs none, and until it is ready: the frame shows as Standard would), and why there is none
    where it cannot be built."""
    key = view_colors.view_key(scene)
    if key is None:
        return None, None, ""
    try:
        return key, view_colors.ready_inverse(key), ""
    except SplatwrightError as e:
        return key, None, str(e)


def draw_frame(texture, inverse: Inverse | None) -> None:
    global _frame_drawing
    if _frame_drawing is None:
        _frame_drawing = FrameDrawing()
    _frame_drawing.draw(texture, inverse)


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
        reason, choice = nothing_to_show(), None
        if not reason:
            try:
                cam, _, choice = placed(context.scene, cam, live.backend.status.get("session"),
                                        lambda o: o.visible_get(view_layer=context.view_layer,
                                                                viewport=context.space_data))
            except SplatwrightError as e:
                reason = str(e)
        if reason:
            self.close_view()
            draw_message(region, f"Splatwright: {reason}")
            return
        if self.view is None:
            self.view = LiveView()
            _views.add(self.view)
        self.view.update(cam, choice)
        key, inverse, colors_error = drawn_inverse(context.scene)
        texture = self.view.texture_of_newest(SRGB_TEXTURE if inverse is None else DISPLAY_TEXTURE)
        if texture is not None:
            gpu.state.blend_set("NONE")  # the frame is already composited over the session's background
            draw_frame(texture, inverse)
            self.view.shown_key = key if inverse is not None else None
        if self.view.stream.error or colors_error:
            draw_message(region, f"Splatwright: {self.view.stream.error or colors_error}")
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
            inverse = self.view_inverse(scene)
            reply, depth_scale = self.fetch(scene)
        except InterruptedError:
            return
        except (SplatwrightError, RemoteError, TimeoutError, OSError) as e:
            self.report({"ERROR"}, f"Splatwright: {e}")
            return
        width, height = reply.fields["width"], reply.fields["height"]
        result = self.begin_result(0, 0, width, height)
        layer = result.layers[0]
        combined = combined_pass(decode_frame(reply), reply.fields["background"], scene.render.film_transparent,
                                 inverse)
        set_pass(layer.passes["Combined"], combined)
        depth = layer.passes.get("Depth")
        if depth is not None:
            set_pass(depth, scene_depths(decode_depth(reply), depth_scale))
        self.end_result(result)

    def view_inverse(self, scene) -> Inverse | None:
        """The inverse of the scene's view transform, None where it shows the sRGB curve's values as they
        are; where it cannot be built, None too, with a warning."""
        key = view_colors.view_key(scene)
        if key is None:
            return None
        try:
            return view_colors.render_inverse(key, self.test_break)
        except SplatwrightError as e:
            self.report({"WARNING"}, f"Splatwright: {e}")
            return None

    def fetch(self, scene):
        """The backend's frame and depth of the scene camera at the output size, or of its render border, and
        the factor that turns its depths into the scene's."""
        if scene.camera is None:
            raise SplatwrightError("the scene has no camera to render through")
        cam = camera_of(scene.camera, scene)
        x, y, width, height = border_rect(scene.render, cam.width, cam.height)
        cam = cam.cropped(x, cam.height - y - height, width, height)  # Blender counts rows from the bottom
        backend, session = live.backend, scene.splatwright.session
        if bpy.app.background and backend.connection == "disconnected":  # nobody pressed Start: -b -a
            backend.connect(prefs(bpy.context).connect_settings())
        cam, depth_scale, choice = placed(scene, cam, backend.status.get("session") or session,
                                          lambda o: not o.hide_render)

        def submit(client):  # on the worker, which the render then no longer holds up
            if not client.call("status")["gaussians"] and session:  # a fresh backend: show the scene's session
                client.call("open_session", name=session, create=False)
                client.call("load_checkpoint")
            return client.submit_render(cam, depth=True, **choice)
        self.update_stats("Splatwright", f"rendering {cam.width}x{cam.height} on the backend")
        pending = backend.wait("render", submit, RENDER_TIMEOUT, self.test_break)
        return wait_done(pending, "render", RENDER_TIMEOUT, self.test_break), depth_scale


def placed(scene, cam: Camera, session: str | None, shown: Callable) -> tuple[Camera, float, dict]:
    """Where a splat object of `session` places its model in the scene (the first by name): the camera to
    render it through for `cam`, taken into the model's space, the factor from the model's depths to the
    scene's, and the model, crop and time to ask for (splats.model_choice); without such an object `cam`
    itself, 1 and the scene's time only (the model the backend shows, as it is). An object that is not
    `shown(obj)` in this view or render, or a placement splats cannot take, raises SplatwrightError."""
    obj = next((o for o in splats.splat_objects(scene) if session and o[splats.SESSION_KEY] == session),
               None)
    if obj is None:
        return cam, 1.0, {"time": splats.scene_time(scene)}
    if not shown(obj):
        raise SplatwrightError(f"the model object {obj.name} is hidden; show it to see its splats")
    return (*splats.placed_camera(obj, cam), splats.model_choice(obj, scene))


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
    view_colors.register()
    bpy.utils.register_class(SPLATWRIGHT_RE_engine)
    for panel in compatible_panels():
        panel.COMPAT_ENGINES.add(SPLATWRIGHT_RE_engine.bl_idname)


def unregister():
    global _frame_drawing
    for panel in compatible_panels():
        panel.COMPAT_ENGINES.discard(SPLATWRIGHT_RE_engine.bl_idname)
    if bpy.app.timers.is_registered(_watch):
        bpy.app.timers.unregister(_watch)
    for view in list(_views):
        view.close()
    bpy.utils.unregister_class(SPLATWRIGHT_RE_engine)
    view_colors.unregister()
    _frame_drawing = None

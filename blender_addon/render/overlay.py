"""Splat models drawn with the scene in the 3D viewport: in Solid, Material Preview and Rendered shading of
Blender's own engines, a draw handler draws the backend's frame of each visible splat object (its colour, alpha
and depth, rendered through the viewport's camera taken into the model's space, cropped to its crop box) after
Blender drew the scene. A small shader sorts the frames of up to MAX_LAYERS objects per pixel by depth and draws
them in passes, each pixel's farthest splats first, each writing its depth through the region's projection, so
Blender's depth buffer decides: a mesh in front hides the splats and splats in front hide the mesh; transparent
splats blend over what is behind them, meshes and other models alike. Final renders layer the models the same
way (composite.ranked_planes). Frames come from a FrameStream thread as the render engine's live view has them
(engine.LiveView: smaller frames while the view moves, held back while a CPU backend trains), so drawing never
waits; each goes to the GPU a strip at a time over as many redraws as it needs (SplatLayer), so no redraw pays
for a whole frame's upload."""
from __future__ import annotations

import time
from collections import deque

import bpy
import gpu
import numpy as np
from bpy.app.handlers import persistent
from gpu_extras.batch import batch_for_shader

from ..core.errors import SplatwrightError
from ..scene import live
from ..scene.reading import region_camera
from ..scene.session import not_connected
from ..scene.splats import model_choice, placed_camera, streamed_objects
from .engine import FRAME_VERTEX, WATCH_INTERVAL, LiveView

SHADINGS = {"SOLID", "MATERIAL", "RENDERED"}
DRAW_ENGINES = {"BLENDER_EEVEE", "BLENDER_EEVEE_NEXT", "BLENDER_WORKBENCH"}  # the others draw as external ones
# Blender blends what draw handlers draw (its overlay buffer) over the colour-managed scene in "display linear"
# space, taken as display values to the power 2.2 (gpu_shader_display_transform_frag.glsl); the frames hold
# display values, so the shader raises them to this power and the viewport shows them as they are.
UI_GAMMA = 2.2

MAX_LAYERS = 4  # objects sorted per pixel in one draw; more are drawn in groups of this many, the farthest first
NOWHERE = 1e30  # the depth of a pixel a frame draws nothing in
STRIP_PIXELS = 1 << 16  # a new frame goes to the GPU this many pixels (whole rows) at a time
UPLOAD_SECONDS = 0.002  # a redraw uploads strips of a new frame until it spent this long
SPARE_TARGETS = 2  # frame-sized GPU buffers a layer keeps for its next frames (the sizes of moving and resting views)

# Each frame is the backend's RGBA8 composited over its background, packed with its depth (codecs.layer_pixels);
# the background is taken out again, so Blender's scene shows through where the splats are transparent. Depths
# are each model's, in its units: layers[i] holds frame i's background (rgb) and the factor to the scene's depths
# (w). Unused layers are empty. A pass draws each pixel's rank-th nearest splats; `projection` is the window
# matrix's part that gives depths.
FRAGMENT_SOURCE = "".join(f"#define {name} {value}\n" for name, value in (
    ("MAX_LAYERS", MAX_LAYERS), ("NOWHERE", NOWHERE), ("UI_GAMMA", UI_GAMMA))) + """
void layer_sample(sampler2D frame_tx, vec4 layer, out vec4 premultiplied, out float depth)
{
  ivec2 size = textureSize(frame_tx, 0);
  vec2 pair = texelFetch(frame_tx, min(ivec2(uv * vec2(size)), size - 1), 0).rg;
  uint rgb = uint(pair.x);
  uint bits = floatBitsToUint(pair.y);
  vec3 shown = vec3(float(rgb & 255u), float((rgb >> 8u) & 255u), float(rgb >> 16u)) / 255.0;
  float alpha = float(bits & 255u) / 255.0;
  vec3 straight = alpha > 0.0 ? clamp((shown - layer.rgb * (1.0 - alpha)) / alpha, 0.0, 1.0) : vec3(0.0);
  premultiplied = vec4(pow(straight, vec3(UI_GAMMA)) * alpha, alpha);
  depth = alpha > 0.0 ? uintBitsToFloat(bits & 0xFFFFFF00u) * layer.w : NOWHERE;
}

void main()
{
  vec4 colors[MAX_LAYERS];
  float depths[MAX_LAYERS];
  SAMPLES
  for (int i = 1; i < MAX_LAYERS; i++) {  /* nearest first */
    for (int j = i; j > 0 && depths[j - 1] > depths[j]; j--) {
      vec4 color = colors[j];
      colors[j] = colors[j - 1];
      colors[j - 1] = color;
      float depth = depths[j];
      depths[j] = depths[j - 1];
      depths[j - 1] = depth;
    }
  }
  if (colors[rank].a <= 0.0) {
    discard;
  }
  float z = -depths[rank];
  gl_FragDepth = 0.5 * (projection.x * z + projection.y) / (projection.z * z + projection.w) + 0.5;
  fragColor = colors[rank];
}
""".replace("SAMPLES", "\n  ".join(f"layer_sample(frame{i}_tx, layers[{i}], colors[{i}], depths[{i}]);"
                                   for i in range(MAX_LAYERS)))

# A strip of a frame's rows (`first_row` on) copied as it is into the frame-sized buffer; `span`: its bottom and
# top in that buffer, as fractions of its height.
STRIP_VERTEX = """
void main()
{
  gl_Position = vec4(2.0 * position.x - 1.0, 2.0 * mix(span.x, span.y, position.y) - 1.0, 0.0, 1.0);
}
"""
STRIP_FRAGMENT = """
void main()
{
  fragColor = vec4(texelFetch(strip_tx, ivec2(gl_FragCoord.xy) - ivec2(0, first_row), 0).rg, 0.0, 1.0);
}
"""

# Main-thread seconds of each draw, newest last (tests read them).
draw_seconds: deque[float] = deque(maxlen=500)
_layers: dict[tuple[int, str], "SplatLayer"] = {}  # (region pointer, object name) -> its frames
_shader = None
_batch = None
_strip_shader = None
_strip_batch = None
_probe = None  # a one-pixel buffer settle() draws into
_empty = None  # the texture of an unused layer: transparent, 1x1
_handle = None


class SplatLayer(LiveView):
    """One splat object's frames in one viewport, with their depth. A new frame goes to the GPU between
    redraws (the _watch timer), a strip of rows at a time, as many strips per tick as UPLOAD_SECONDS allow,
    into a float buffer of its size (an offscreen: the strips are drawn into it); the layer shows the last whole
    frame until the new one is all there. So neither a redraw nor a tick pays for a whole frame: a 1920x1080 one
    takes tens of ms to upload on a software GL, where a strip takes one or two, and a software GL that draws
    into another buffer in the middle of a redraw first finishes the redraw's work so far."""

    def __init__(self):
        super().__init__()
        self.stream.depth = True
        self.shown = None  # the whole frame the layer draws
        self.target = None  # the GPUOffScreen holding it (codecs.layer_pixels)
        self.drawn_seq = 0  # the frame the viewport last drew
        self.filling = None  # [frame, its GPUOffScreen, rows there] of a newer frame on its way up
        self.spares: list = []  # offscreens free for the next frames, newest last
        self.strips = 0  # strips uploaded (tests and benchmarks read it)

    def newest(self):
        """The whole frame to draw (the newest one uploaded)."""
        self.drawn_seq = self.texture_seq
        return self.shown

    def upload(self, deadline: float) -> None:
        """Upload strips of the newest frame of the time shown until perf_counter() passes `deadline` (one at
        least)."""
        frame = self.stream.frame
        if self.to_upload(frame) and (self.filling is None or self.filling[0] is not frame):
            if self.filling is not None:
                self.spares.append(self.filling[1])
            self.filling = [frame, self.offscreen(frame.fields["width"], frame.fields["height"]), 0]
        first = True
        while self.filling is not None and (first or time.perf_counter() < deadline):
            frame, target, row = self.filling
            self.filling[2], first = upload_strip(target, frame, row), False
            self.strips += 1
            if self.filling[2] == frame.fields["height"]:
                if self.target is not None:
                    self.spares.append(self.target)
                settle(target.texture_color)
                self.shown, self.target, self.filling, self.texture_seq = frame, target, None, frame.seq

    def to_upload(self, frame) -> bool:
        """`frame` (the stream's newest) is of the time shown and not uploaded yet."""
        return frame is not None and frame.seq != self.texture_seq and self.of_this_time(frame)

    def frame_to_show(self) -> bool:
        return self.texture_seq != self.drawn_seq

    def waiting(self) -> bool:
        # a frame that arrived after this tick's upload is still to be uploaded
        return super().waiting() or self.filling is not None or self.to_upload(self.stream.frame)

    def offscreen(self, width: int, height: int):
        """A frame-sized buffer: a spare one of that size, or a new one."""
        fits = [o for o in self.spares if (o.width, o.height) == (width, height)]
        if fits:
            self.spares.remove(fits[-1])
            return fits[-1]
        del self.spares[:-SPARE_TARGETS]
        return gpu.types.GPUOffScreen(width, height, format="RGBA32F")


def upload_strip(target, frame, row: int) -> int:
    """Upload the next strip of `frame` (rows `row` on) into `target`; the row after it."""
    width, height = frame.fields["width"], frame.fields["height"]
    end = min(height, row + max(1, STRIP_PIXELS // width))
    data = frame.pixels[2 * width * row:2 * width * end]
    strip = gpu.types.GPUTexture((width, end - row), format="RG32F",
                                 data=gpu.types.Buffer("FLOAT", len(data), data))
    copy_texels(strip, target, row, (row / height, end / height))
    return end


def settle(texture) -> None:
    """Sample `texture`, just drawn into, once here between redraws: a software GL (Mesa's llvmpipe) otherwise
    makes the first redraw that samples a texture drawn into wait tens of ms at 1920x1080, even with the draws
    into it finished (a GPU's driver costs little either way)."""
    global _probe
    if _probe is None:
        _probe = gpu.types.GPUOffScreen(1, 1, format="RGBA32F")
    copy_texels(texture, _probe, 0, (0.0, 1.0))


def copy_texels(source, target, first_row: int, span: tuple[float, float]) -> None:
    """Draw `source`'s texels as they are into the rows of offscreen `target` that `span` covers (fractions of
    its height; source row 0 at `first_row`), and wait until that is done (by reading a pixel of it back)."""
    program = strip_shader()
    depth_test, blend = gpu.state.depth_test_get(), gpu.state.blend_get()
    gpu.state.depth_test_set("NONE")
    gpu.state.blend_set("NONE")
    with target.bind():
        program.bind()
        program.uniform_sampler("strip_tx", source)
        program.uniform_int("first_row", first_row)
        program.uniform_float("span", span)
        _strip_batch.draw(program)
        gpu.state.active_framebuffer_get().read_color(0, first_row, 1, 1, 4, 0, "FLOAT")
    gpu.state.depth_test_set(depth_test)
    gpu.state.blend_set(blend)


def strip_shader():
    global _strip_shader, _strip_batch
    if _strip_shader is None:
        info = gpu.types.GPUShaderCreateInfo()
        info.vertex_in(0, "VEC2", "position")
        info.sampler(0, "FLOAT_2D", "strip_tx")
        info.push_constant("VEC2", "span")
        info.push_constant("INT", "first_row")
        info.fragment_out(0, "VEC4", "fragColor")
        info.vertex_source(STRIP_VERTEX)
        info.fragment_source(STRIP_FRAGMENT)
        _strip_shader = gpu.shader.create_from_info(info)
        _strip_batch = batch_for_shader(_strip_shader, "TRI_STRIP", {"position": [(0, 0), (1, 0), (0, 1), (1, 1)]})
    return _strip_shader


def shader():
    global _shader, _batch, _empty
    if _shader is None:
        info = gpu.types.GPUShaderCreateInfo()
        interface = gpu.types.GPUStageInterfaceInfo("splatwright_layer_interface")
        interface.smooth("VEC2", "uv")
        info.vertex_in(0, "VEC2", "position")
        info.vertex_out(interface)
        for i in range(MAX_LAYERS):
            info.sampler(i, "FLOAT_2D", f"frame{i}_tx")
        info.push_constant("VEC4", "projection")
        info.push_constant("MAT4", "layers")
        info.push_constant("INT", "rank")
        info.fragment_out(0, "VEC4", "fragColor")
        if hasattr(info, "depth_write"):  # Blender 4.0+; the GPU backends other than OpenGL need to know
            info.depth_write("ANY")
        info.vertex_source(FRAME_VERTEX)  # the engine's: a full-region quad
        info.fragment_source(FRAGMENT_SOURCE)
        _shader = gpu.shader.create_from_info(info)
        _batch = batch_for_shader(_shader, "TRI_STRIP", {"position": [(-1, -1), (1, -1), (-1, 1), (1, 1)]})
        _empty = gpu.types.GPUTexture((1, 1), format="RGBA32F", data=gpu.types.Buffer("FLOAT", 4, [0.0] * 4))
    return _shader


def drawn_objects(context) -> list:
    """The splat objects this viewport shows now, while the backend is there to draw them."""
    space = context.space_data
    if space.shading.type not in SHADINGS or not_connected():
        return []
    if space.shading.type == "RENDERED" and context.scene.render.engine == "SPLATWRIGHT":
        return []  # the Splatwright engine draws the model itself
    return [o for o in streamed_objects(context.scene) if o.visible_get(view_layer=context.view_layer, viewport=space)]


def draw() -> None:
    """The draw handler (POST_VIEW: in the region's view, after the scene)."""
    start = time.perf_counter()
    draw_layers(bpy.context)
    draw_seconds.append(time.perf_counter() - start)


def draw_layers(context) -> None:
    region, rv3d = context.region, context.region_data
    objects = drawn_objects(context)
    region_key = region.as_pointer()
    names = {o.name for o in objects}
    for key in [k for k in _layers if k[0] == region_key and k[1] not in names]:
        _layers.pop(key).close()
    if not objects:
        return
    try:
        view = region_camera(region, rv3d)
    except SplatwrightError:
        return  # an orthographic view: the splats need a perspective one
    drawn = []  # (distance from the view, layer, background, depth factor)
    for obj in objects:
        try:
            cam, depth_scale = placed_camera(obj, view)
            choice = model_choice(obj, context.scene)
        except SplatwrightError:
            continue  # scaled unevenly, or a crop box of no size: the panel says so
        layer = _layers.get((region_key, obj.name))
        if layer is None:
            layer = _layers[(region_key, obj.name)] = SplatLayer()
        layer.update(cam, choice)
        frame = layer.newest()
        if frame is not None and layer.of_this_time(frame):
            distance = float(np.linalg.norm(view.c2w[:3, 3] - np.array(obj.matrix_world.translation)))
            drawn.append((distance, layer, frame.fields["background"], depth_scale))
    drawn.sort(key=lambda d: -d[0])
    for first in range(0, len(drawn), MAX_LAYERS):
        draw_frames([d[1:] for d in drawn[first:first + MAX_LAYERS]], rv3d.window_matrix, has_depth(context))
    if not bpy.app.timers.is_registered(_watch):
        bpy.app.timers.register(_watch, first_interval=WATCH_INTERVAL)


def refusal(name: str) -> str:
    """Why the backend sent no frame of splat object `name` to a viewport (its session has no model, say), or
    ''."""
    return next((layer.stream.error for (_, shown), layer in _layers.items() if shown == name and layer.stream.error),
                "")


def has_depth(context) -> bool:
    """Whether the depth buffer holds the scene's. Rendered shading of an external engine (Cycles) draws the
    meshes' depth only for the overlays: with them hidden, the splats are drawn over the whole render."""
    space = context.space_data
    return (space.shading.type != "RENDERED" or context.scene.render.engine in DRAW_ENGINES
            or space.overlay.show_overlays)


def draw_frames(frames: list, window_matrix, depth_tested: bool) -> None:
    """Up to MAX_LAYERS frames layered per pixel by depth: (layer, background, depth factor) each."""
    program = shader()
    depth_test, depth_mask, blend = gpu.state.depth_test_get(), gpu.state.depth_mask_get(), gpu.state.blend_get()
    gpu.state.depth_test_set("LESS_EQUAL" if depth_tested else "ALWAYS")
    gpu.state.depth_mask_set(False)  # Blender's depth buffer stays the scene's
    gpu.state.blend_set("ALPHA_PREMULT")
    program.bind()
    layers = []  # column i: frame i's background and depth factor
    for i in range(MAX_LAYERS):
        layer, background, depth_scale = frames[i] if i < len(frames) else (None, (0.0, 0.0, 0.0), 1.0)
        program.uniform_sampler(f"frame{i}_tx", layer.target.texture_color if layer is not None else _empty)
        layers += [*background, depth_scale]
    m = window_matrix  # clip z and w of a view-space point (0, 0, z, 1)
    program.uniform_float("projection", (m[2][2], m[2][3], m[3][2], m[3][3]))
    program.uniform_float("layers", layers)
    for rank in reversed(range(len(frames))):  # each pixel's farthest splats first
        program.uniform_int("rank", rank)
        _batch.draw(program)
    gpu.state.depth_test_set(depth_test)
    gpu.state.depth_mask_set(depth_mask)
    gpu.state.blend_set(blend)


def _watch() -> float | None:
    """Timer: upload strips of new frames, and redraw the viewports when a frame is all there or a resting view
    is due a full-size one; closes the frames of viewports that are gone. It ends when no layer waits for
    anything."""
    regions = {region.as_pointer() for window in bpy.context.window_manager.windows
               for area in window.screen.areas if area.type == "VIEW_3D" for region in area.regions}
    for key in [k for k in _layers if k[0] not in regions]:
        _layers.pop(key).close()
    layers = list(_layers.values())
    deadline = time.perf_counter() + UPLOAD_SECONDS
    for layer in layers:
        layer.upload(deadline)
    stale = [layer.stale() for layer in layers]
    if any(stale):
        live.redraw({"VIEW_3D"})
    return WATCH_INTERVAL if any(stale) or any(layer.waiting() for layer in layers) else None


def close_layers() -> None:
    for layer in _layers.values():
        layer.close()
    _layers.clear()


@persistent
def _file_loaded(*args) -> None:
    close_layers()


def register():
    global _handle
    if bpy.app.background:
        return  # nothing is drawn without a window (and the bpy module crashes at exit with a draw handler left)
    _handle = bpy.types.SpaceView3D.draw_handler_add(draw, (), "WINDOW", "POST_VIEW")
    bpy.app.handlers.load_post.append(_file_loaded)


def unregister():
    global _handle
    if _handle is None:
        return
    bpy.app.handlers.load_post.remove(_file_loaded)
    bpy.types.SpaceView3D.draw_handler_remove(_handle, "WINDOW")
    _handle = None
    if bpy.app.timers.is_registered(_watch):
        bpy.app.timers.unregister(_watch)
    close_layers()

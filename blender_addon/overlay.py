"""Splat models drawn with the scene in the 3D viewport: in Solid, Material Preview and Rendered shading of
Blender's own engines, a draw handler draws the backend's frame of each visible splat object (its colour, alpha
and depth, rendered through the viewport's camera taken into the model's space, cropped to its crop box) after
Blender drew the scene. A small shader sorts the frames of up to MAX_LAYERS objects per pixel by depth and draws
them in passes, each pixel's farthest splats first, each writing its depth through the region's projection, so
Blender's depth buffer decides: a mesh in front hides the splats and splats in front hide the mesh; transparent
splats blend over what is behind them, meshes and other models alike. Final renders layer the models the same
way (composite.ranked_planes). Frames come from a FrameStream thread as the render engine's live view has them
(engine.LiveView: smaller frames while the view moves, held back while a CPU backend trains), so drawing never
waits."""
from __future__ import annotations

import time
from collections import deque

import bpy
import gpu
import numpy as np
from bpy.app.handlers import persistent
from gpu_extras.batch import batch_for_shader

from . import live
from .core.errors import SplatwrightError
from .engine import FRAME_VERTEX, WATCH_INTERVAL, LiveView
from .operators import not_connected
from .scene_io import region_camera
from .scene_splats import model_choice, placed_camera, splat_objects

SHADINGS = {"SOLID", "MATERIAL", "RENDERED"}
DRAW_ENGINES = {"BLENDER_EEVEE", "BLENDER_EEVEE_NEXT", "BLENDER_WORKBENCH"}  # the others draw as external ones
# Blender blends what draw handlers draw (its overlay buffer) over the colour-managed scene in "display linear"
# space, taken as display values to the power 2.2 (gpu_shader_display_transform_frag.glsl); the frames hold
# display values, so the shader raises them to this power and the viewport shows them as they are.
UI_GAMMA = 2.2

MAX_LAYERS = 4  # objects sorted per pixel in one draw; more are drawn in groups of this many, the farthest first
NOWHERE = 1e30  # the depth of a pixel a frame draws nothing in

# Each frame is the backend's RGBA8 composited over its background; the background is taken out again, so
# Blender's scene shows through where the splats are transparent. Depths are each model's, in its units:
# layers[i] holds frame i's background (rgb) and the factor to the scene's depths (w). Unused layers are empty.
# A pass draws each pixel's rank-th nearest splats; `projection` is the window matrix's part that gives depths.
FRAGMENT_SOURCE = "".join(f"#define {name} {value}\n" for name, value in (
    ("MAX_LAYERS", MAX_LAYERS), ("NOWHERE", NOWHERE), ("UI_GAMMA", UI_GAMMA))) + """
void layer_sample(sampler2D color_tx, sampler2D depth_tx, vec4 layer, out vec4 premultiplied, out float depth)
{
  ivec2 size = textureSize(color_tx, 0);
  ivec2 texel = min(ivec2(uv * vec2(size)), size - 1);
  vec4 shown = texelFetch(color_tx, texel, 0);
  float alpha = shown.a;
  vec3 straight = alpha > 0.0 ? clamp((shown.rgb - layer.rgb * (1.0 - alpha)) / alpha, 0.0, 1.0) : vec3(0.0);
  premultiplied = vec4(pow(straight, vec3(UI_GAMMA)) * alpha, alpha);
  depth = alpha > 0.0 ? texelFetch(depth_tx, texel, 0).r * layer.w : NOWHERE;
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
""".replace("SAMPLES", "\n  ".join(f"layer_sample(color{i}_tx, depth{i}_tx, layers[{i}], colors[{i}], depths[{i}]);"
                                   for i in range(MAX_LAYERS)))

# Main-thread seconds of each draw, newest last (tests read them).
draw_seconds: deque[float] = deque(maxlen=500)
_layers: dict[tuple[int, str], "SplatLayer"] = {}  # (region pointer, object name) -> its frames
_shader = None
_batch = None
_empty = None  # the textures of an unused layer: transparent, 1x1
_handle = None


class SplatLayer(LiveView):
    """One splat object's frames in one viewport, with their depth, as GPU textures."""

    def __init__(self):
        super().__init__()
        self.stream.depth = True
        self.color = self.depth = None

    def newest(self):
        """The newest frame, its textures uploaded here when it is new (the stream's thread prepared both
        buffers, so this is two copies)."""
        frame = self.stream.frame
        if frame is not None and frame.seq != self.texture_seq:
            size = (frame.fields["width"], frame.fields["height"])
            self.color = gpu.types.GPUTexture(size, format="RGBA8",
                                              data=gpu.types.Buffer("FLOAT", len(frame.pixels), frame.pixels))
            self.depth = gpu.types.GPUTexture(size, format="R32F",
                                              data=gpu.types.Buffer("FLOAT", len(frame.depth), frame.depth))
            self.texture_seq = frame.seq
        return frame


def shader():
    global _shader, _batch, _empty
    if _shader is None:
        info = gpu.types.GPUShaderCreateInfo()
        interface = gpu.types.GPUStageInterfaceInfo("splatwright_layer_interface")
        interface.smooth("VEC2", "uv")
        info.vertex_in(0, "VEC2", "position")
        info.vertex_out(interface)
        for i in range(MAX_LAYERS):
            info.sampler(2 * i, "FLOAT_2D", f"color{i}_tx")
            info.sampler(2 * i + 1, "FLOAT_2D", f"depth{i}_tx")
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
        _empty = (gpu.types.GPUTexture((1, 1), format="RGBA8", data=gpu.types.Buffer("FLOAT", 4, [0.0] * 4)),
                  gpu.types.GPUTexture((1, 1), format="R32F", data=gpu.types.Buffer("FLOAT", 1, [NOWHERE])))
    return _shader


def drawn_objects(context) -> list:
    """The splat objects this viewport shows now, while the backend is there to draw them."""
    space = context.space_data
    if space.shading.type not in SHADINGS or not_connected():
        return []
    if space.shading.type == "RENDERED" and context.scene.render.engine == "SPLATWRIGHT":
        return []  # the Splatwright engine draws the model itself
    return [o for o in splat_objects(context.scene) if o.visible_get(view_layer=context.view_layer, viewport=space)]


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
            choice = model_choice(obj)
        except SplatwrightError:
            continue  # scaled unevenly, or a crop box of no size: the panel says so
        layer = _layers.get((region_key, obj.name))
        if layer is None:
            layer = _layers[(region_key, obj.name)] = SplatLayer()
        layer.update(cam, choice)
        frame = layer.newest()
        if frame is not None:
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
        color, depth = (layer.color, layer.depth) if layer is not None else _empty
        program.uniform_sampler(f"color{i}_tx", color)
        program.uniform_sampler(f"depth{i}_tx", depth)
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
    """Timer: redraw the viewports when a frame arrived or a resting view is due a full-size one; closes the
    frames of viewports that are gone. It ends when no layer waits for anything."""
    regions = {region.as_pointer() for window in bpy.context.window_manager.windows
               for area in window.screen.areas if area.type == "VIEW_3D" for region in area.regions}
    for key in [k for k in _layers if k[0] not in regions]:
        _layers.pop(key).close()
    layers = list(_layers.values())
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

"""Splat models drawn with the scene in the 3D viewport: in Solid, Material Preview and Rendered shading of
Blender's own engines, a draw handler draws the backend's frame of each visible splat object (its colour, alpha
and depth, rendered through the viewport's camera taken into the model's space) after Blender drew the scene.
A small shader writes each pixel's depth through the region's projection, so Blender's depth buffer decides:
a mesh in front hides the splats and splats in front hide the mesh; transparent splats blend over what is
behind them. Frames come from a FrameStream thread as the render engine's live view has them (engine.LiveView:
smaller frames while the view moves, held back while a CPU backend trains), so drawing never waits."""
from __future__ import annotations

import time
from collections import deque

import bpy
import gpu
from bpy.app.handlers import persistent
from gpu_extras.batch import batch_for_shader

from . import live
from .core.errors import SplatwrightError
from .engine import FRAME_VERTEX, WATCH_INTERVAL, LiveView
from .scene_io import region_camera
from .scene_splats import not_shown, placed_camera, splat_objects

SHADINGS = {"SOLID", "MATERIAL", "RENDERED"}
DRAW_ENGINES = {"BLENDER_EEVEE", "BLENDER_EEVEE_NEXT", "BLENDER_WORKBENCH"}  # the others draw as external ones
# Blender blends what draw handlers draw (its overlay buffer) over the colour-managed scene in "display linear"
# space, taken as display values to the power 2.2 (gpu_shader_display_transform_frag.glsl); the frames hold
# display values, so the shader raises them to this power and the viewport shows them as they are.
UI_GAMMA = 2.2

# The frame is the backend's RGBA8 composited over its background; the background is taken out again, so
# Blender's scene shows through where the splats are transparent. Depths are the model's, in its units.
FRAGMENT_SOURCE = """
void main()
{
  ivec2 size = textureSize(color_tx, 0);
  ivec2 texel = min(ivec2(uv * vec2(size)), size - 1);
  vec4 shown = texelFetch(color_tx, texel, 0);
  float alpha = shown.a;
  if (alpha <= 0.0) {
    discard;
  }
  vec3 straight = clamp((shown.rgb - background * (1.0 - alpha)) / alpha, 0.0, 1.0);
  float depth = texelFetch(depth_tx, texel, 0).r * depth_scale;
  vec4 clip = winmat * vec4(0.0, 0.0, -depth, 1.0);
  gl_FragDepth = 0.5 * clip.z / clip.w + 0.5;
  fragColor = vec4(pow(straight, vec3(ui_gamma)) * alpha, alpha);
}
"""

# Main-thread seconds of each draw, newest last (tests read them).
draw_seconds: deque[float] = deque(maxlen=500)
_layers: dict[tuple[int, str], "SplatLayer"] = {}  # (region pointer, object name) -> its frames
_shader = None
_batch = None
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
    global _shader, _batch
    if _shader is None:
        info = gpu.types.GPUShaderCreateInfo()
        interface = gpu.types.GPUStageInterfaceInfo("splatwright_layer_interface")
        interface.smooth("VEC2", "uv")
        info.vertex_in(0, "VEC2", "position")
        info.vertex_out(interface)
        info.sampler(0, "FLOAT_2D", "color_tx")
        info.sampler(1, "FLOAT_2D", "depth_tx")
        info.push_constant("MAT4", "winmat")
        info.push_constant("VEC3", "background")
        info.push_constant("FLOAT", "depth_scale")
        info.push_constant("FLOAT", "ui_gamma")
        info.fragment_out(0, "VEC4", "fragColor")
        if hasattr(info, "depth_write"):  # Blender 4.0+; the GPU backends other than OpenGL need to know
            info.depth_write("ANY")
        info.vertex_source(FRAME_VERTEX)  # the engine's: a full-region quad
        info.fragment_source(FRAGMENT_SOURCE)
        _shader = gpu.shader.create_from_info(info)
        _batch = batch_for_shader(_shader, "TRI_STRIP", {"position": [(-1, -1), (1, -1), (-1, 1), (1, 1)]})
    return _shader


def drawn_objects(context) -> list:
    """The splat objects this viewport shows now, whose models the backend shows."""
    space = context.space_data
    if space.shading.type not in SHADINGS:
        return []
    if space.shading.type == "RENDERED" and context.scene.render.engine == "SPLATWRIGHT":
        return []  # the Splatwright engine draws the model itself
    return [o for o in splat_objects(context.scene)
            if o.visible_get(view_layer=context.view_layer, viewport=space) and not not_shown(o)]


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
    for obj in objects:
        try:
            cam, depth_scale = placed_camera(obj, view)
        except SplatwrightError:
            continue  # scaled unevenly: the panel says so
        layer = _layers.get((region_key, obj.name))
        if layer is None:
            layer = _layers[(region_key, obj.name)] = SplatLayer()
        layer.update(cam)
        frame = layer.newest()
        if frame is not None:
            draw_frame(layer, frame.fields["background"], rv3d.window_matrix, depth_scale, has_depth(context))
    if not bpy.app.timers.is_registered(_watch):
        bpy.app.timers.register(_watch, first_interval=WATCH_INTERVAL)


def has_depth(context) -> bool:
    """Whether the depth buffer holds the scene's. Rendered shading of an external engine (Cycles) draws the
    meshes' depth only for the overlays: with them hidden, the splats are drawn over the whole render."""
    space = context.space_data
    return (space.shading.type != "RENDERED" or context.scene.render.engine in DRAW_ENGINES
            or space.overlay.show_overlays)


def draw_frame(layer: SplatLayer, background, window_matrix, depth_scale: float, depth_tested: bool) -> None:
    program = shader()
    depth_test, depth_mask, blend = gpu.state.depth_test_get(), gpu.state.depth_mask_get(), gpu.state.blend_get()
    gpu.state.depth_test_set("LESS_EQUAL" if depth_tested else "ALWAYS")
    gpu.state.depth_mask_set(False)  # Blender's depth buffer stays the scene's
    gpu.state.blend_set("ALPHA_PREMULT")
    program.bind()
    program.uniform_sampler("color_tx", layer.color)
    program.uniform_sampler("depth_tx", layer.depth)
    program.uniform_float("winmat", window_matrix)
    program.uniform_float("background", background)
    program.uniform_float("depth_scale", depth_scale)
    program.uniform_float("ui_gamma", UI_GAMMA)
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

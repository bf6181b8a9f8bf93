"""Splat models in the final renders of Blender's engines (F12, animation renders, `blender -b file.blend -f 1`):
before each render a handler asks the backend for its frame of the splat object through the scene camera
(colour, alpha and depth) and puts it into two images, which the scene's compositor combines with the render
layer by depth (a Z Combine node between the render and the Composite output). Without a splat object to render
the images are left empty (transparent, and as far as the Depth pass's background), which passes the render on
as it is.

The nodes and images are made on the main thread when a model is added, as an animation render (and `-f`)
copies the scene's node tree before the handler runs: from then on the handler only fills the images, which
renders share. One splat object is composited for now; the nodes are named so that each may get its own."""
from __future__ import annotations

import queue

import bpy
import numpy as np
from bpy.app.handlers import persistent

from . import live, scene_splats, view_colors  # scene_splats imports this module too: its names are looked up when used
from .colors import combined_pass
from .core import codecs, protocol
from .core.client import RemoteError, decode_depth, decode_frame, wait_done
from .core.errors import SplatwrightError
from .engine import RENDER_TIMEOUT
from .preferences import prefs
from .scene_io import camera_of

COMBINE_NODE = "Splatwright Z Combine"
COLOR_NODE = COLOR_IMAGE = "Splatwright Splats"
DEPTH_NODE = DEPTH_IMAGE = "Splatwright Splats Depth"
SUPERSEDED_TRIES = 3  # a live view's request may take the backend's one waiting place before the render starts
REPORT_INTERVAL = 0.5
_reports: queue.SimpleQueue = queue.SimpleQueue()  # (level, message) from render threads, for the main thread


def compositor_tree(scene, create: bool):
    """The scene's compositor node tree (scene.node_tree before Blender 5.0, its compositing node group from
    5.0), made with Render Layers feeding the output where there is none and `create` says so; or None."""
    if bpy.app.version >= (5, 0, 0):
        if scene.compositing_node_group is None and create:
            tree = bpy.data.node_groups.new("Compositor", "CompositorNodeTree")
            tree.interface.new_socket("Image", in_out="OUTPUT", socket_type="NodeSocketColor")
            layers, output = tree.nodes.new("CompositorNodeRLayers"), tree.nodes.new("NodeGroupOutput")
            tree.links.new(layers.outputs["Image"], output.inputs[0])
            scene.compositing_node_group = tree
        return scene.compositing_node_group
    if not scene.use_nodes and create:
        scene.use_nodes = True  # makes Render Layers -> Composite
    return scene.node_tree if scene.use_nodes else None


def output_input(tree):
    """The input of the node whose image the render keeps (Composite; from Blender 5.0 the Group Output)."""
    for node in tree.nodes:
        if node.bl_idname == "CompositorNodeComposite" or (node.bl_idname == "NodeGroupOutput"
                                                           and node.is_active_output):
            return node.inputs[0]
    raise SplatwrightError("the scene's compositor has no Composite output; add one to render the splats")


def prepare(scene):
    """The scene's Z Combine of the render and the splats' images, made on first use: between what feeds the
    output and the output, with the Depth pass turned on."""
    tree = compositor_tree(scene, create=True)
    for view_layer in scene.view_layers:
        if not view_layer.use_pass_z:  # set only when it changes: a render's thread may call this
            view_layer.use_pass_z = True
    combine = tree.nodes.get(COMBINE_NODE)
    if combine is not None:
        return combine
    scene.render.use_compositing = True
    output = output_input(tree)
    layers = next((n for n in tree.nodes if n.bl_idname == "CompositorNodeRLayers"), None) \
        or tree.nodes.new("CompositorNodeRLayers")
    render = output.links[0].from_socket if output.is_linked else layers.outputs["Image"]
    combine = tree.nodes.new("CompositorNodeZcombine")
    color, depth = tree.nodes.new("CompositorNodeImage"), tree.nodes.new("CompositorNodeImage")
    for node, name in ((combine, COMBINE_NODE), (color, COLOR_NODE), (depth, DEPTH_NODE)):
        node.name = node.label = name
    combine.location = output.node.location[0], output.node.location[1] - 250
    color.location = combine.location[0] - 300, combine.location[1] - 100
    depth.location = combine.location[0] - 300, combine.location[1] - 400
    # Inputs by position, as Blender 4.5 and 5.0 name them differently: image A, depth A, image B, depth B,
    # then (from 4.5; properties before) use alpha and anti-alias.
    tree.links.new(render, combine.inputs[0])
    tree.links.new(layers.outputs["Depth"], combine.inputs[1])
    tree.links.new(color.outputs["Image"], combine.inputs[2])
    tree.links.new(depth.outputs["Image"], combine.inputs[3])
    # Transparent splats blend over what is behind them; each pixel is the nearer one's, as in the viewport.
    for index, option, value in ((4, "use_alpha", True), (5, "use_antialias_z", False)):
        if len(combine.inputs) > index:
            combine.inputs[index].default_value = value
        else:
            setattr(combine, option, value)
    tree.links.new(combine.outputs[0], output)
    width, height = scene.render.resolution_x, scene.render.resolution_y
    fill_images(tree, *empty_planes(width, height))
    return combine


def rendered(obj, scene) -> bool:
    return not obj.hide_render and any(obj.name in layer.objects for layer in scene.view_layers if layer.use)


@persistent
def render_pre(scene, *args) -> None:
    """Before a final render (on its thread in a Blender window): the splats into their images, or the images
    emptied."""
    if scene.render.engine == "SPLATWRIGHT" or not scene.render.use_compositing:
        return  # the engine renders the model itself; a capture renders the scene alone
    objects = [o for o in scene_splats.splat_objects(scene) if rendered(o, scene)]
    tree = compositor_tree(scene, create=False)
    if not objects:
        if tree is not None and COMBINE_NODE in tree.nodes:
            fill_images(tree, *empty_planes(*current_size(tree)))
        return
    obj = objects[0]
    if len(objects) > 1:
        report("WARNING", f"final renders composite one splat object for now: {obj.name}, not "
                          f"{', '.join(o.name for o in objects[1:])}")
    try:
        tree = prepare(scene).id_data
        planes = splat_planes(*fetch(scene, obj), view_inverse(scene))
    except (SplatwrightError, RemoteError, TimeoutError, OSError, ValueError) as e:
        report("ERROR", f"{obj.name} is left out of this render: {e}")
        tree = compositor_tree(scene, create=False)
        if tree is None or COMBINE_NODE not in tree.nodes:
            return
        planes = empty_planes(*current_size(tree))
    fill_images(tree, *planes)


def view_inverse(scene):
    """The inverse of the scene's view transform for the splats' colours (None: the sRGB curve's values as they
    are, also where it could not be built, with a warning)."""
    key = view_colors.view_key(scene)
    if key is None:
        return None
    try:
        return view_colors.render_inverse(key, never)
    except SplatwrightError as e:
        report("WARNING", f"the splats' colours follow the Standard view transform in this render: {e}")
        return None


def current_size(tree) -> tuple[int, int]:
    """The size of the splats' images now (empty ones of any size pass the render on)."""
    image = tree.nodes[COLOR_NODE].image
    return tuple(image.size) if image is not None else (1, 1)


def fetch(scene, obj):
    """The backend's render reply for `obj`'s model through the scene camera, and its depth factor."""
    if scene.camera is None:
        raise SplatwrightError("the scene has no camera to render through")
    if scene.render.use_border:
        raise SplatwrightError("render regions are not composited with splats yet; turn Render Region off")
    cam, depth_scale = scene_splats.placed_camera(obj, camera_of(scene.camera, scene), "it")
    backend, session = live.backend, obj[scene_splats.SESSION_KEY]
    if bpy.app.background and backend.connection == "disconnected":  # nobody pressed Start: -b -f
        backend.connect(prefs(bpy.context).connect_settings())

    def submit(client):  # on the worker, which the render then no longer holds up
        scene_splats.show_session(client, session)
        return client.submit_render(cam, depth=True)
    for attempt in range(SUPERSEDED_TRIES):
        pending = backend.wait("render", submit, RENDER_TIMEOUT, never)
        try:
            return wait_done(pending, "render", RENDER_TIMEOUT, never), depth_scale
        except RemoteError as e:
            if e.code != protocol.SUPERSEDED or attempt == SUPERSEDED_TRIES - 1:
                raise


def never() -> bool:
    return False  # Python cannot see a render's Esc


def splat_planes(reply, depth_scale: float, inverse=None) -> tuple[int, int, np.ndarray, np.ndarray]:
    """The size of a render reply, its straight scene-linear colours with alpha (through `inverse`, the scene's
    view transform undone, where it is not Standard), and its depths in the scene's units (the background's as
    the Depth pass has it), each flat RGBA."""
    width, height = reply.fields["width"], reply.fields["height"]
    color = combined_pass(decode_frame(reply), reply.fields["background"], True, inverse).reshape(-1, 4)
    alpha = color[:, 3:]
    # Z Combine mixes by the nearer image's alpha: mix(behind, front, alpha). Blender takes a float image's
    # pixels as premultiplied and passes them on as they are, so straight colours give front * alpha once.
    color[:, :3] = np.where(alpha > 0, color[:, :3] / np.maximum(alpha, 1e-6), 0.0)
    depth = decode_depth(reply).ravel()
    depth = np.where(depth < codecs.DEPTH_BACKGROUND, depth * depth_scale, codecs.DEPTH_BACKGROUND)
    planes = np.repeat(depth.astype(np.float32)[:, None], 4, axis=1)
    planes[:, 3] = 1.0
    return width, height, color, planes


def empty_planes(width: int, height: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """Images that leave the render as it is: transparent, and behind everything."""
    depth = np.full((width * height, 4), codecs.DEPTH_BACKGROUND, np.float32)
    depth[:, 3] = 1.0
    return width, height, np.zeros((width * height, 4), np.float32), depth


def fill_images(tree, width: int, height: int, color: np.ndarray, depth: np.ndarray) -> None:
    for node_name, image_name, values, is_data in ((COLOR_NODE, COLOR_IMAGE, color, False),
                                                   (DEPTH_NODE, DEPTH_IMAGE, depth, True)):
        image, node = float_image(image_name, width, height, values.ravel(), is_data), tree.nodes[node_name]
        if node.image != image:
            node.image = image


def float_image(name: str, width: int, height: int, pixels: np.ndarray, is_data: bool):
    """The float image `name` holding `pixels` (flat RGBA, rows bottom-up), made or resized as needed."""
    image = bpy.data.images.get(name)
    if image is None:
        image = bpy.data.images.new(name, width, height, alpha=True, float_buffer=True)
        image.generated_color = (0.0, 0.0, 0.0, 0.0)  # what a reopened file holds until a render fills it
        image.colorspace_settings.is_data = is_data
        image.alpha_mode = "PREMUL"  # its pixels pass on as they are (splat_planes says why)
    elif tuple(image.size) != (width, height):
        image.scale(width, height)
    image.pixels.foreach_set(pixels)
    image.update()
    return image


def report(level: str, message: str) -> None:
    """Into Blender's reports: at once without a window (a render there blocks the main thread until Blender
    quits), else from the main thread's timer, as a render in a window runs on a thread of its own."""
    if bpy.app.background:
        live.report(level, message)
    else:
        _reports.put((level, message))


def _deliver_reports() -> float:
    while not _reports.empty():
        live.report(*_reports.get())
    return REPORT_INTERVAL


def register():
    bpy.app.handlers.render_pre.append(render_pre)
    bpy.app.timers.register(_deliver_reports, first_interval=REPORT_INTERVAL, persistent=True)


def unregister():
    if bpy.app.timers.is_registered(_deliver_reports):
        bpy.app.timers.unregister(_deliver_reports)
    bpy.app.handlers.render_pre.remove(render_pre)

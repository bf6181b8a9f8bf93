"""Splat models in the final renders of Blender's engines (F12, animation renders, `blender -b file.blend -f 1`):
before each render a handler asks the backend for its frame of each splat object through the scene camera
(colour, alpha and depth, cropped to the object's crop box) and sorts them per pixel by depth into RANKS pairs of
images: rank 0 holds the nearest splats of each pixel, rank 1 the next, and so on. The scene's compositor combines
them with the render layer by depth, the farthest rank first, through a chain of Z Combine nodes between the
render and the Composite output, so each pixel's splats and meshes are layered in their order, as the viewport
layers them (render/overlay.py). Without a splat object to render the images are left empty (transparent, and as far as
the Depth pass's background), which passes the render on as it is.

The nodes and images are made on the main thread when a model is added, as an animation render (and `-f`)
copies the scene's node tree before the handler runs: from then on the handler only fills the images, which
renders share."""
from __future__ import annotations

import queue

import bpy
import numpy as np
from bpy.app.handlers import persistent

from ..core import codecs, protocol
from ..core.client import RemoteError, decode_depth, decode_frame, wait_done
from ..core.errors import SplatwrightError
from ..logic.colors import combined_pass
from ..logic.placement import scene_depths
from ..scene import live, splats
from ..scene.addon import prefs
from ..scene.reading import camera_of
from . import view_colors
from .engine import RENDER_TIMEOUT

# Splat objects layered exactly in each pixel; the farther ones of a pixel with more are merged into the last rank.
RANKS = 4
SUPERSEDED_TRIES = 3  # a live view's request may take the backend's one waiting place before the render starts
REPORT_INTERVAL = 0.5
_reports: queue.SimpleQueue = queue.SimpleQueue()  # (level, message) from render threads, for the main thread


def compositor_tree(scene, create: bool):
    """The scene's compositor node tree, made with Render Layers feeding the output where there is none and `create`
    says so; or None. Before Blender 5.0 that is scene.node_tree; from 5.0 the scene's compositing node group; from
    5.3, where a scene has a stack of compositor effects (each on the image of the one before), the node group of
    the active effect, as compositing_node_group, deprecated there, gives it."""
    if hasattr(scene, "compositor_effects"):
        effect = scene.compositor_effects.active
        if create and (effect is None or effect.node_group is None):
            effect = effect or scene.compositor_effects.new(name="Compositor")
            effect.node_group = new_compositor_group()
        return effect.node_group if effect is not None else None
    if bpy.app.version >= (5, 0, 0):
        if scene.compositing_node_group is None and create:
            scene.compositing_node_group = new_compositor_group()
        return scene.compositing_node_group
    if not scene.use_nodes and create:
        scene.use_nodes = True  # makes Render Layers -> Composite
    return scene.node_tree if scene.use_nodes else None


def new_compositor_group():
    """A compositing node group (Blender 5.0 and later) of Render Layers feeding its output."""
    tree = bpy.data.node_groups.new("Compositor", "CompositorNodeTree")
    tree.interface.new_socket("Image", in_out="OUTPUT", socket_type="NodeSocketColor")
    layers, output = tree.nodes.new("CompositorNodeRLayers"), tree.nodes.new("NodeGroupOutput")
    tree.links.new(layers.outputs["Image"], output.inputs[0])
    return tree


def output_input(tree):
    """The input of the node whose image the render keeps (Composite; from Blender 5.0 the Group Output)."""
    for node in tree.nodes:
        if node.bl_idname == "CompositorNodeComposite" or (node.bl_idname == "NodeGroupOutput"
                                                           and node.is_active_output):
            return node.inputs[0]
    raise SplatwrightError("the scene's compositor has no Composite output; add one to render the splats")


def rank_names(rank: int) -> tuple[str, str, str]:
    """The names of rank `rank`'s Z Combine node, and of its colour and depth image nodes (and images)."""
    return f"Splatwright Z Combine {rank}", f"Splatwright Splats {rank}", f"Splatwright Splats Depth {rank}"


def prepare(scene):
    """The scene's compositor tree, with its chain of Z Combines of the render and the splats' images made on
    first use (between what feeds the output and the output) and the Depth pass turned on."""
    tree = compositor_tree(scene, create=True)
    for view_layer in scene.view_layers:
        if not view_layer.use_pass_z:  # set only when it changes: a render's thread may call this
            view_layer.use_pass_z = True
    if rank_names(0)[0] in tree.nodes:
        return tree
    scene.render.use_compositing = True
    output = output_input(tree)
    layers = next((n for n in tree.nodes if n.bl_idname == "CompositorNodeRLayers"), None) \
        or tree.nodes.new("CompositorNodeRLayers")
    image, depth = output.links[0].from_socket if output.is_linked else layers.outputs["Image"], layers.outputs["Depth"]
    x, y = output.node.location
    for rank in reversed(range(RANKS)):  # the farthest first: each nearer rank goes over what is behind it
        combine = tree.nodes.new("CompositorNodeZcombine")
        color_node, depth_node = tree.nodes.new("CompositorNodeImage"), tree.nodes.new("CompositorNodeImage")
        for node, name in zip((combine, color_node, depth_node), rank_names(rank)):
            node.name = node.label = name
        combine.location = x - 400 * rank, y - 250
        color_node.location, depth_node.location = (x - 400 * rank - 300, y - 350), (x - 400 * rank - 300, y - 650)
        # Inputs by position, as Blender 4.5 and 5.0 name them differently: image A, depth A, image B, depth B,
        # then (from 4.5; properties before) use alpha and anti-alias; outputs: image, depth.
        for socket, index in ((image, 0), (depth, 1), (color_node.outputs["Image"], 2),
                              (depth_node.outputs["Image"], 3)):
            tree.links.new(socket, combine.inputs[index])
        # Transparent splats blend over what is behind them; each pixel is the nearer one's, as in the viewport.
        for index, option, value in ((4, "use_alpha", True), (5, "use_antialias_z", False)):
            if len(combine.inputs) > index:
                combine.inputs[index].default_value = value
            else:
                setattr(combine, option, value)
        image, depth = combine.outputs[0], combine.outputs[1]
    tree.links.new(image, output)
    fill_images(tree, empty_ranks(scene.render.resolution_x, scene.render.resolution_y))
    return tree


def rendered(obj, scene) -> bool:
    return not obj.hide_render and any(obj.name in layer.objects for layer in scene.view_layers if layer.use)


@persistent
def render_pre(scene, *args) -> None:
    """Before a final render (on its thread in a Blender window): the splats into their images, or the images
    emptied."""
    if scene.render.engine == "SPLATWRIGHT" or not scene.render.use_compositing:
        return  # the engine renders the model itself; a capture renders the scene alone
    # An animation render (and -f N) evaluates each frame for the render alone, leaving the scene's objects as the
    # frame evaluated last placed them; the splats' cameras need this frame's. Without a window this runs on the
    # main thread; a window's render thread may change the scene only while Lock Interface is on.
    if bpy.app.background or scene.render.use_lock_interface:
        scene.frame_set(scene.frame_current, subframe=scene.frame_subframe)
    objects = [o for o in splats.streamed_objects(scene) if rendered(o, scene)]
    tree = compositor_tree(scene, create=False)
    if not objects:
        if tree is not None and rank_names(0)[0] in tree.nodes:
            fill_images(tree, empty_ranks(*current_size(tree)))
        return
    try:
        tree = prepare(scene)
    except SplatwrightError as e:
        report("ERROR", f"the splat objects are left out of this render: {e}")
        return
    inverse, layers = view_inverse(scene), []
    for obj in objects:
        try:
            layers.append(splat_planes(*fetch(scene, obj), inverse))
        except (SplatwrightError, RemoteError, TimeoutError, OSError, ValueError) as e:
            report("ERROR", f"{obj.name} is left out of this render: {e}")
    fill_images(tree, ranked_planes(layers) if layers else empty_ranks(*current_size(tree)))


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
    image = tree.nodes[rank_names(0)[1]].image
    return tuple(image.size) if image is not None else (1, 1)


def fetch(scene, obj):
    """The backend's render reply for `obj`'s model through the scene camera, and its depth factor."""
    if scene.camera is None:
        raise SplatwrightError("the scene has no camera to render through")
    if scene.render.use_border:
        raise SplatwrightError("render regions are not composited with splats yet; turn Render Region off")
    cam, depth_scale = splats.placed_camera(obj, camera_of(scene.camera, scene), "it")
    choice, backend = splats.model_choice(obj, scene), live.backend
    if bpy.app.background and backend.connection == "disconnected":  # nobody pressed Start: -b -f
        backend.connect(prefs(bpy.context).connect_settings())

    def submit(client):  # on the worker, which the render then no longer holds up
        return client.submit_render(cam, depth=True, **choice)
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
    planes = np.repeat(scene_depths(decode_depth(reply), depth_scale)[:, None], 4, axis=1)
    planes[:, 3] = 1.0
    return width, height, color, planes


def ranked_planes(layers: list) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """Several models' splat_planes (of one size) sorted per pixel by depth into RANKS planes: rank k holds each
    pixel's k-th nearest splats; the last rank also those behind them, blended nearest first. Each rank's
    nearest depth is its depth."""
    width, height = layers[0][:2]
    colors = np.stack([layer[2] for layer in layers])  # (models, pixels, RGBA), straight
    depths = np.stack([layer[3][:, 0] for layer in layers])
    order = np.argsort(depths, axis=0, kind="stable")
    colors, depths = np.take_along_axis(colors, order[..., None], 0), np.take_along_axis(depths, order, 0)
    ranks = []
    for rank in range(RANKS):
        group = slice(rank, rank + 1 if rank < RANKS - 1 else None)
        if rank >= len(layers):
            ranks.append(empty_planes(width, height))
            continue
        merged = np.zeros_like(colors[0])  # premultiplied
        for color in colors[group]:
            merged += (1.0 - merged[:, 3:]) * np.concatenate([color[:, :3] * color[:, 3:], color[:, 3:]], axis=1)
        alpha = merged[:, 3:]
        merged[:, :3] = np.where(alpha > 0, merged[:, :3] / np.maximum(alpha, 1e-6), 0.0)
        planes = np.repeat(depths[rank][:, None], 4, axis=1)
        planes[:, 3] = 1.0
        ranks.append((width, height, merged, planes))
    return ranks


def empty_planes(width: int, height: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """Images that leave the render as it is: transparent, and behind everything."""
    depth = np.full((width * height, 4), codecs.DEPTH_BACKGROUND, np.float32)
    depth[:, 3] = 1.0
    return width, height, np.zeros((width * height, 4), np.float32), depth


def empty_ranks(width: int, height: int) -> list:
    return [empty_planes(width, height)] * RANKS


def fill_images(tree, ranks: list) -> None:
    """Each rank's planes (width, height, colour, depth) into its images."""
    for rank, (width, height, color, depth) in enumerate(ranks):
        _, color_name, depth_name = rank_names(rank)
        for name, values, is_data in ((color_name, color, False), (depth_name, depth, True)):
            image, node = float_image(name, width, height, values.ravel(), is_data), tree.nodes[name]
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

"""The scene of the splat scenarios, in Blender's window (splats_gui.py) and in the bpy module (splats.py,
splats_animation.py): a wall through the model's middle, a cube in front of it and a camera looking at them;
where the model object is moved to, where a second model and a crop box go.
"""
from __future__ import annotations

import bpy
from mathutils import Euler, Matrix, Vector

WALL_COLOR, CUBE_COLOR = (0.1, 0.45, 0.2), (0.05, 0.1, 0.6)
CUBE_AT, CUBE_SIZE = (0.45, -2.0, 0.0), 0.5  # in front of the model, which sits around the origin
CAMERA_AT, LOOK_AT, RENDER_SIZE = (0.0, -6.0, 0.6), (0.0, 0.0, 0.2), (64, 48)
MOVE = Matrix.Translation((-0.3, 0.0, -0.2)) @ Euler((0.0, 0.0, 0.35)).to_matrix().to_4x4()
SECOND_AT = Matrix.Translation((0.35, -3.4, 0.25)) @ Matrix.Scale(0.5, 4)  # a second model, in front of the first
CROP_LOCATION, CROP_SCALE = (0.45, 0.0, 0.1), (0.6, 1.5, 1.5)  # in the first model object's space: its right part
SIZE = (80, 60)  # build_render_scene's renders (render_with_cycles alone renders RENDER_SIZE)


def emitting(obj, rgb) -> None:
    """`rgb` as the object's Solid colour and as its material's Emission, which renders it as it is."""
    obj.color = (*rgb, 1.0)
    material = bpy.data.materials.new(obj.name)
    if bpy.app.version < (5, 0, 0):  # from 5.0 a material always uses its nodes
        material.use_nodes = True
    nodes = material.node_tree.nodes
    nodes.clear()
    emission, output = nodes.new("ShaderNodeEmission"), nodes.new("ShaderNodeOutputMaterial")
    emission.inputs["Color"].default_value = (*rgb, 1.0)
    material.node_tree.links.new(emission.outputs["Emission"], output.inputs["Surface"])
    obj.data.materials.append(material)


def add_wall_and_cube(scene) -> None:
    """A wall (the plane y = 0, facing -y) through the model's middle, a cube in front of it, and a camera
    looking at them; the display values as the renders hold them."""
    scene.view_settings.view_transform = "Standard"
    scene.render.dither_intensity = 0.0  # the display transform's noise would blur the comparisons
    bpy.ops.mesh.primitive_plane_add(size=20.0, rotation=(1.5707963, 0.0, 0.0))
    bpy.context.active_object.name = "Wall"
    emitting(bpy.context.active_object, WALL_COLOR)
    bpy.ops.mesh.primitive_cube_add(size=CUBE_SIZE, location=CUBE_AT)
    bpy.context.active_object.name = "Cube"
    emitting(bpy.context.active_object, CUBE_COLOR)
    bpy.ops.object.select_all(action="DESELECT")
    camera = bpy.data.objects.new("Camera", bpy.data.cameras.new("Camera"))
    camera.location = CAMERA_AT
    camera.rotation_euler = (Vector(LOOK_AT) - Vector(CAMERA_AT)).to_track_quat("-Z", "Y").to_euler()
    scene.collection.objects.link(camera)
    scene.camera = camera


def render_with_cycles(scene) -> None:
    scene.render.engine = "CYCLES"
    scene.cycles.device, scene.cycles.samples, scene.cycles.use_denoising, scene.cycles.seed = "CPU", 1, False, 1
    scene.render.resolution_x, scene.render.resolution_y = RENDER_SIZE
    scene.render.resolution_percentage = 100


def build_render_scene():
    """The scene alone in an empty file, for final renders with Cycles of SIZE."""
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    add_wall_and_cube(scene)
    render_with_cycles(scene)
    scene.cycles.samples = 4
    scene.render.resolution_x, scene.render.resolution_y = SIZE
    scene.render.image_settings.file_format, scene.render.image_settings.color_mode = "PNG", "RGBA"
    return scene

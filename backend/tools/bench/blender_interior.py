"""A bench scene made with real Blender (run by the bpy module: `python -m backend bench scenes`): a furnished
room seen from cameras inside it, 16:9, no transparency, rendered with Cycles under the Standard view
transform and written as a dataset `python -m backend train` reads (the add-on's DatasetWriter and camera
conversion, so the scene reaches the trainer as a capture would).

    python backend/tools/bench/blender_interior.py --out DIR [--views 96] [--test-every 6] [--width 640] [--samples 32]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import bpy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: the add-on's modules
from blender_addon.logic.dataset import DatasetWriter, split_of  # noqa: E402
from blender_addon.scene.reading import camera_of  # noqa: E402

ROOM = (8.0, 6.0, 3.0)  # x, y, z extent in metres, floor at z = 0


def material(name: str, color, roughness: float = 0.6, texture: str = "", scale: float = 4.0, dark: float = 0.35):
    """A principled material, optionally modulated by a procedural texture (so surfaces have detail to fit)
    between `color` and `dark` times it. The bench scenes share it."""
    mat = bpy.data.materials.new(name)
    mat.use_nodes = True
    nodes, links = mat.node_tree.nodes, mat.node_tree.links
    bsdf = nodes["Principled BSDF"]
    bsdf.inputs["Roughness"].default_value = roughness
    if not texture:
        bsdf.inputs["Base Color"].default_value = (*color, 1.0)
        return mat
    tex = nodes.new({"checker": "ShaderNodeTexChecker", "noise": "ShaderNodeTexNoise",
                     "wave": "ShaderNodeTexWave", "brick": "ShaderNodeTexBrick"}[texture])
    tex.inputs["Scale"].default_value = scale
    ramp = nodes.new("ShaderNodeValToRGB")
    ramp.color_ramp.elements[0].color = (*[c * dark for c in color], 1.0)
    ramp.color_ramp.elements[1].color = (*color, 1.0)
    links.new(tex.outputs["Fac"], ramp.inputs["Fac"])
    links.new(ramp.outputs["Color"], bsdf.inputs["Base Color"])
    return mat


def box(name: str, center, size, mat) -> None:
    bpy.ops.mesh.primitive_cube_add(location=center)
    obj = bpy.context.active_object
    obj.name = name
    obj.scale = [s / 2 for s in size]
    obj.data.materials.append(mat)


def cylinder(name: str, center, radius: float, depth: float, mat) -> None:
    bpy.ops.mesh.primitive_cylinder_add(radius=radius, depth=depth, location=center, vertices=32)
    bpy.context.active_object.name = name
    bpy.context.active_object.data.materials.append(mat)


def sphere(name: str, center, radius: float, mat) -> None:
    bpy.ops.mesh.primitive_uv_sphere_add(radius=radius, location=center)
    obj = bpy.context.active_object
    obj.name = name
    bpy.ops.object.shade_smooth()
    obj.data.materials.append(mat)


def build_room(rng: np.random.Generator) -> None:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    x, y, z = ROOM
    t = 0.1
    box("floor", (0, 0, -t / 2), (x, y, t), material("floor", (0.55, 0.38, 0.22), texture="wave", scale=3.0))
    box("ceiling", (0, 0, z + t / 2), (x, y, t), material("ceiling", (0.9, 0.9, 0.88)))
    walls = [("wall_n", (0, y / 2 + t / 2, z / 2), (x, t, z), (0.75, 0.7, 0.55), "noise"),
             ("wall_s", (0, -y / 2 - t / 2, z / 2), (x, t, z), (0.55, 0.65, 0.75), "noise"),
             ("wall_e", (x / 2 + t / 2, 0, z / 2), (t, y, z), (0.8, 0.55, 0.5), "brick"),
             ("wall_w", (-x / 2 - t / 2, 0, z / 2), (t, y, z), (0.6, 0.75, 0.6), "noise")]
    for name, center, size, color, texture in walls:
        box(name, center, size, material(name, color, texture=texture, scale=6.0))
    wood, fabric = material("wood", (0.45, 0.25, 0.1), texture="wave", scale=8.0), \
        material("fabric", (0.2, 0.3, 0.6), roughness=0.9, texture="noise", scale=20.0)
    box("table_top", (0.5, 0.3, 0.75), (1.6, 0.9, 0.06), wood)
    for dx in (-0.7, 0.7):
        for dy in (-0.38, 0.38):
            box("table_leg", (0.5 + dx, 0.3 + dy, 0.36), (0.06, 0.06, 0.72), wood)
    box("sofa_seat", (-2.6, -1.5, 0.25), (2.2, 0.9, 0.5), fabric)
    box("sofa_back", (-2.6, -1.9, 0.65), (2.2, 0.2, 0.8), fabric)
    for dx in (-1.05, 1.05):
        box("sofa_arm", (-2.6 + dx, -1.5, 0.45), (0.2, 0.9, 0.5), fabric)
    box("shelf", (3.6, 1.5, 1.0), (0.4, 1.6, 2.0), material("shelf", (0.3, 0.2, 0.15), texture="checker", scale=3.0))
    for i in range(12):  # things on the shelf and the table, of many colours
        color = tuple(rng.uniform(0.1, 0.95, 3))
        mat = material(f"thing{i}", color, roughness=float(rng.uniform(0.2, 0.8)))
        if i < 8:
            sphere("thing", (3.3, 0.9 + 0.17 * i, 0.4 + 0.5 * (i % 3)), 0.08 + 0.03 * (i % 2), mat)
        else:
            cylinder("thing", (0.2 + 0.2 * (i - 8), 0.3, 0.85), 0.05, 0.16, mat)
    box("rug", (0.3, -0.4, 0.005), (3.0, 2.0, 0.01), material("rug", (0.7, 0.15, 0.15), texture="checker", scale=6))
    for i, (px, color) in enumerate([(-1.8, (0.9, 0.7, 0.1)), (0.8, (0.1, 0.5, 0.8))]):
        box(f"picture{i}", (px, y / 2 - 0.02, 1.7), (1.0, 0.03, 0.7),
            material(f"picture{i}", color, roughness=0.3, texture="noise", scale=3.0))
    cylinder("lamp_post", (-3.4, 2.3, 0.8), 0.03, 1.6, material("metal", (0.6, 0.6, 0.6), roughness=0.3))
    sphere("lamp_shade", (-3.4, 2.3, 1.7), 0.22, material("shade", (0.95, 0.9, 0.7), roughness=0.9))

    bpy.ops.object.light_add(type="AREA", location=(0, 0, z - 0.05))
    light = bpy.context.active_object
    light.data.energy, light.data.size = 120.0, 3.0
    bpy.ops.object.light_add(type="POINT", location=(-3.0, 2.0, 2.0))
    bpy.context.active_object.data.energy = 40.0
    world = bpy.data.worlds.new("world")
    world.use_nodes = True
    world.node_tree.nodes["Background"].inputs["Strength"].default_value = 0.05
    bpy.context.scene.world = world


def camera_poses(count: int, rng: np.random.Generator) -> list[tuple[tuple, tuple]]:
    """Positions inside the room's free space, looking around (yaw anywhere, pitch a little down or up)."""
    poses = []
    for _ in range(count):
        location = (rng.uniform(-2.8, 2.8), rng.uniform(-1.8, 1.8), rng.uniform(1.1, 1.9))
        pitch = math.radians(90 + rng.uniform(-25, 10))  # Blender cameras look down -Z: 90 degrees is level
        poses.append((location, (pitch, 0.0, rng.uniform(0, 2 * math.pi))))
    return poses


def render_views(writer: DatasetWriter, poses: list[tuple[tuple, tuple]], test_every: int) -> None:
    """Render the scene from a camera at each pose (the render settings as the scene has them) and write the
    views as a dataset: every `test_every`-th is held out."""
    scene = bpy.context.scene
    data = bpy.data.cameras.new("camera")
    data.lens, data.sensor_width, data.clip_end = 20.0, 36.0, 50.0
    camera = bpy.data.objects.new("camera", data)
    scene.collection.objects.link(camera)
    scene.camera = camera
    start = time.perf_counter()
    for i, (location, rotation) in enumerate(poses):
        camera.location, camera.rotation_euler = location, rotation
        bpy.context.view_layer.update()
        split, name = split_of(i, test_every), f"r_{i}"
        scene.render.filepath = str(writer.image_path(split, name))
        bpy.ops.render.render(write_still=True)
        writer.add(split, name, camera_of(camera, scene))
        print(f"view {i + 1}/{len(poses)} ({time.perf_counter() - start:.0f} s)", flush=True)
    writer.write()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--views", type=int, default=96)
    p.add_argument("--test-every", type=int, default=6)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--samples", type=int, default=32)
    args = p.parse_args(argv)
    rng = np.random.default_rng(7)
    build_room(rng)
    scene = bpy.context.scene
    r = scene.render
    r.engine = "CYCLES"
    scene.cycles.samples = args.samples
    scene.cycles.use_denoising = True
    scene.cycles.device = "CPU"
    r.resolution_x, r.resolution_y, r.resolution_percentage = args.width, args.width * 9 // 16, 100
    r.film_transparent = False
    r.image_settings.file_format, r.image_settings.color_mode, r.image_settings.color_depth = "PNG", "RGB", "8"
    scene.view_settings.view_transform = "Standard"
    render_views(DatasetWriter(args.out), camera_poses(args.views, rng), args.test_every)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv[1:]))

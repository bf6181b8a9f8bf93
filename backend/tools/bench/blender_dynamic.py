"""A moving bench scene made with real Blender (run by the bpy module), for `python -m backend bench dynamic`: on a
textured floor, a ball rolls across, a tilted box spins, a striped column sways (a shape key) and two things
stand still, seen over an animation by fixed cameras on a hemisphere around it. Rendered with Cycles on the
CPU under the Standard view transform, opaque (the world is white to the camera, the trainer's default
background, and a dim sky to the lights), as JPEGs in a D-NeRF-layout dataset (the add-on's DatasetWriter and
camera conversion, each view with its frame's `time`):

- train: every training camera at every captured frame (every `--frame-step`-th of the animation);
- test: every held-out camera at every captured frame;
- val: the held-out cameras at `--between` frames between the captured ones (times no training view has).

    python backend/tools/bench/blender_dynamic.py --out DIR [--frames 48] [--frame-step 2] [--cameras 20]
        [--test-every 5] [--between 6] [--width 400] [--samples 8] [--points 20000]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import bpy
import numpy as np
from mathutils import Matrix

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: the add-on's modules
from blender_addon.core.cameras import BLENDER_TO_OPENCV, look_at  # noqa: E402
from blender_addon.core.points import POINTS_FILE, write_points  # noqa: E402
from blender_addon.logic.dataset import DatasetWriter, frame_time, split_of  # noqa: E402
from blender_addon.scene.reading import camera_of, surface_points  # noqa: E402
from backend.tools.bench.blender_interior import material  # noqa: E402

CENTER = (0.0, 0.0, 0.5)  # what the cameras look at
FLOOR = 8.0  # side of the square floor, in metres, its top at z = 0
BALL = 0.45  # the rolling ball's radius


def textured(name: str, color, texture: str, scale: float, roughness: float = 0.6):
    """The bench scenes' material with a procedural texture (detail to fit, and to see motion by)."""
    return material(name, color, roughness, texture, scale, dark=0.3)


def named(name: str, mat):
    """The object just added, named and given `mat`."""
    obj = bpy.context.active_object
    obj.name = name
    obj.data.materials.append(mat)
    return obj


def column(name: str, location, radius: float, height: float, rings: int, sides: int, mat):
    """A closed cylinder standing on `location`, cut into `rings` bands so that it can bend smoothly."""
    angles = np.linspace(0.0, 2.0 * math.pi, sides, endpoint=False)
    verts = [(radius * math.cos(a), radius * math.sin(a), height * k / rings) for k in range(rings + 1) for a in angles]
    faces = [(k * sides + j, k * sides + (j + 1) % sides, (k + 1) * sides + (j + 1) % sides, (k + 1) * sides + j)
             for k in range(rings) for j in range(sides)]
    faces += [tuple(reversed(range(sides))), tuple(rings * sides + j for j in range(sides))]
    mesh = bpy.data.meshes.new(name)
    mesh.from_pydata(verts, [], faces)
    mesh.materials.append(mat)
    obj = bpy.data.objects.new(name, mesh)
    obj.location = location
    bpy.context.scene.collection.objects.link(obj)
    for polygon in mesh.polygons:
        polygon.use_smooth = True
    return obj


def build_scene(frames: int) -> None:
    """The scene and its animation over frames 1..`frames` (keys interpolated linearly)."""
    bpy.ops.wm.read_factory_settings(use_empty=True)
    bpy.context.preferences.edit.keyframe_new_interpolation_type = "LINEAR"
    scene = bpy.context.scene
    scene.frame_start, scene.frame_end = 1, frames

    bpy.ops.mesh.primitive_cube_add(location=(0, 0, -0.05))
    named("floor", textured("floor", (0.85, 0.75, 0.55), "checker", 12.0)).scale = (FLOOR / 2, FLOOR / 2, 0.05)
    bpy.ops.mesh.primitive_cone_add(radius1=0.4, depth=1.4, location=(-1.4, 1.3, 0.7), vertices=32)
    named("cone", textured("cone", (0.2, 0.6, 0.3), "noise", 6.0))
    bpy.ops.mesh.primitive_cube_add(location=(1.5, -1.5, 0.25))
    named("crate", textured("crate", (0.6, 0.35, 0.15), "wave", 5.0)).scale = (0.5, 0.35, 0.25)

    # Translation (and the rotation rolling makes): the ball rolls along x, turning about y by distance / radius.
    bpy.ops.mesh.primitive_uv_sphere_add(radius=BALL, location=(-2.0, -0.4, BALL), segments=48, ring_count=24)
    ball = named("ball", textured("ball", (0.9, 0.15, 0.1), "checker", 4.0, roughness=0.4))
    bpy.ops.object.shade_smooth()
    ball.keyframe_insert("location", frame=1)
    ball.keyframe_insert("rotation_euler", frame=1)
    ball.location.x = 2.0
    ball.rotation_euler.y = 4.0 / BALL
    ball.keyframe_insert("location", frame=frames)
    ball.keyframe_insert("rotation_euler", frame=frames)

    # Rotation: a box tilted about x spins a full turn about z, bobbing up and down once.
    bpy.ops.mesh.primitive_cube_add(location=(1.1, 1.1, 0.7), rotation=(0.35, 0.0, 0.0))
    box = named("box", textured("box", (0.2, 0.4, 0.9), "brick", 3.0))
    box.scale = (0.35, 0.35, 0.35)
    box.keyframe_insert("rotation_euler", frame=1)
    box.keyframe_insert("location", frame=1)
    box.location.z = 1.1
    box.keyframe_insert("location", frame=(1 + frames) // 2)
    box.location.z = 0.7
    box.rotation_euler.z = 2.0 * math.pi
    box.keyframe_insert("rotation_euler", frame=frames)
    box.keyframe_insert("location", frame=frames)

    # Deformation: a striped column bends one way, then the other, through a shape key.
    height = 1.8
    col = column("column", (-0.3, 1.4, 0.0), 0.18, height, rings=24, sides=24,
                 mat=textured("column", (0.95, 0.8, 0.1), "wave", 3.0))
    col.shape_key_add(name="basis")
    bend = col.shape_key_add(name="bend")
    for point in bend.data:
        point.co.x += 0.8 * (point.co.z / height) ** 2
    bend.slider_min = -1.0
    for frame, value in ((1, 0.0), (frames // 3, 1.0), (2 * frames // 3, -1.0), (frames, 0.0)):
        bend.value = value
        bend.keyframe_insert("value", frame=frame)

    bpy.ops.object.light_add(type="SUN", rotation=(math.radians(40), math.radians(15), math.radians(30)))
    bpy.context.active_object.data.energy = 3.0
    bpy.ops.object.light_add(type="AREA", location=(-2.0, -3.0, 4.0))
    light = bpy.context.active_object
    light.data.energy, light.data.size = 400.0, 3.0
    light.rotation_euler = (math.radians(40), 0.0, math.radians(-35))
    world = bpy.data.worlds.new("world")
    world.use_nodes = True
    nodes, links = world.node_tree.nodes, world.node_tree.links
    sky = nodes["Background"]
    sky.inputs["Color"].default_value, sky.inputs["Strength"].default_value = (0.6, 0.7, 0.9, 1.0), 0.3
    seen = nodes.new("ShaderNodeBackground")
    seen.inputs["Color"].default_value, seen.inputs["Strength"].default_value = (1.0, 1.0, 1.0, 1.0), 1.0
    mix = nodes.new("ShaderNodeMixShader")
    links.new(nodes.new("ShaderNodeLightPath").outputs["Is Camera Ray"], mix.inputs["Fac"])
    links.new(sky.outputs["Background"], mix.inputs[1])
    links.new(seen.outputs["Background"], mix.inputs[2])
    links.new(mix.outputs["Shader"], nodes["World Output"].inputs["Surface"])
    scene.world = world


def camera_poses(count: int, radius: float, seed: int = 3) -> list[np.ndarray]:
    """Blender camera-to-world matrices of `count` cameras looking at CENTER from a hemisphere's band between
    15 and 60 degrees of elevation: a Fibonacci lattice, evenly spread, turned about Z by a seeded angle."""
    low, high = math.sin(math.radians(15)), math.sin(math.radians(60))
    offset = np.random.default_rng(seed).uniform(0.0, 2.0 * math.pi)
    poses = []
    for i in range(count):
        z = high - (high - low) * (i + 0.5) / count
        ring, angle = math.sqrt(1.0 - z * z), offset + i * math.pi * (3.0 - math.sqrt(5.0))
        eye = np.asarray(CENTER) + radius * np.array([ring * math.cos(angle), ring * math.sin(angle), z])
        poses.append(look_at(eye, CENTER) @ BLENDER_TO_OPENCV)
    return poses


def between_frames(captured: list[int], count: int) -> list[int]:
    """`count` frames spread over the captured range, none of them captured."""
    picks = np.linspace(captured[0], captured[-1], count + 2)[1:-1]
    free = [f for f in range(captured[0], captured[-1]) if f not in captured]
    return sorted({min(free, key=lambda f: (abs(f - p), f)) for p in picks}) if free else []


def setup_render(width: int, samples: int) -> None:
    scene = bpy.context.scene
    r = scene.render
    r.engine = "CYCLES"
    scene.cycles.device = "CPU"
    scene.cycles.samples = samples
    scene.cycles.use_denoising = True  # OpenImageDenoise, its fast prefilter: 8 samples are then ~40 dB of 64's
    scene.cycles.denoising_prefilter, scene.cycles.denoising_quality = "FAST", "BALANCED"
    scene.cycles.max_bounces = 2
    r.use_persistent_data = True  # keep the scene between renders: only the camera or the frame changes
    r.resolution_x = r.resolution_y = width
    r.resolution_percentage = 100
    r.film_transparent = False
    r.image_settings.file_format, r.image_settings.color_mode, r.image_settings.quality = "JPEG", "RGB", 90
    scene.view_settings.view_transform = "Standard"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--frames", type=int, default=48, help="the animation's length")
    p.add_argument("--frame-step", type=int, default=2, help="capture every this many frames")
    p.add_argument("--cameras", type=int, default=20)
    p.add_argument("--test-every", type=int, default=5, help="every this-th camera is held out")
    p.add_argument("--between", type=int, default=6, help="held-out frames between the captured ones (val)")
    p.add_argument("--width", type=int, default=400, help="image width and height")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--radius", type=float, default=6.5, help="the cameras' distance from the scene's centre")
    p.add_argument("--points", type=int, default=20_000,
                   help="initial points from the meshes at the first frame, as a capture keeps them (0: none)")
    args = p.parse_args(argv)
    build_scene(args.frames)
    setup_render(args.width, args.samples)
    scene = bpy.context.scene
    data = bpy.data.cameras.new("camera")
    data.lens, data.sensor_width = 40.0, 36.0
    cameras = []
    for i, pose in enumerate(camera_poses(args.cameras, args.radius)):
        camera = bpy.data.objects.new(f"camera{i:02d}", data)
        camera.matrix_world = Matrix(pose.tolist())
        scene.collection.objects.link(camera)
        cameras.append((camera, split_of(i, args.test_every)))

    captured = list(range(1, args.frames + 1, args.frame_step))
    renders = [(f, camera, split) for f in captured for camera, split in cameras]
    renders += [(f, camera, "val") for f in between_frames(captured, args.between)
                for camera, split in cameras if split == "test"]
    writer = DatasetWriter(args.out, extension=".jpg")
    if args.points:
        scene.frame_set(captured[0])
        args.out.mkdir(parents=True, exist_ok=True)
        write_points(args.out / POINTS_FILE, *surface_points(bpy.context, args.points, seed=0))
    start = time.perf_counter()
    for k, (frame, camera, split) in enumerate(renders):
        if frame != scene.frame_current:
            scene.frame_set(frame)
        scene.camera = camera
        name = f"{camera.name}_f{frame:03d}"
        scene.render.filepath = str(writer.image_path(split, name))
        bpy.ops.render.render(write_still=True)
        writer.add(split, name, camera_of(camera, scene), frame_time(frame, captured[0], captured[-1]))
        print(f"render {k + 1}/{len(renders)} {split} {name} ({time.perf_counter() - start:.0f} s)", flush=True)
    writer.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv[1:]))

"""A 1920x1080 bench scene made with real Blender, for `bench train --data DIR`: blender_interior.py's furnished
room with finer detail (rows of books, a chessboard, a poster of small print, noise and grain of many octaves,
so that 1080p shows more than 720p would), seen from cameras inside it, opaque, rendered with Eevee under the
Standard view transform and written as JPEGs in a NeRF-synthetic dataset (the add-on's DatasetWriter and
camera conversion, as blender_interior.py writes it).

Eevee needs an OpenGL context, which Debian's Blender 3.4 gets from an X server (Mesa's llvmpipe on a machine
without a GPU: about 9 s a view on two cores, where Cycles on the CPU takes minutes at 1080p and the bpy
module's Eevee Next about 100 s). The defaults (180 views: 160 train, 20 test; JPEG quality 90) make about
20 MB (40 minutes on two cores shared with another render):

    xvfb-run -a -s "-screen 0 1920x1080x24" blender -b --factory-startup --python backend/tools/bench/blender_hd.py \\
        -- --out .bench-data/hd [--views 180] [--test-every 9] [--width 1920] [--samples 3] [--quality 90]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import bpy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout: the add-on's and the bench's modules
from blender_addon.logic.dataset import DatasetWriter  # noqa: E402
from backend.tools.bench.blender_interior import (ROOM, box, build_room, camera_poses, material,  # noqa: E402
                                                  render_views)


def books(x: float, y0: float, y1: float, z: float, depth: float, rng: np.random.Generator) -> None:
    """A row of books standing along y from y0 to y1 on a surface at height z, their spines facing -x."""
    y = y0
    while True:
        thick, height = float(rng.uniform(0.025, 0.06)), float(rng.uniform(0.18, 0.3))
        if y + thick > y1:
            return
        color = tuple(rng.uniform(0.05, 0.9, 3))
        mat = material(f"book{len(bpy.data.materials)}", color, roughness=0.7, texture="wave", scale=40.0, dark=0.7)
        box("book", (x, y + thick / 2, z + height / 2), (depth * float(rng.uniform(0.8, 1.0)), thick * 0.95, height),
            mat)
        y += thick


def add_detail(rng: np.random.Generator) -> None:
    """Finer detail on the room: textures of more octaves, and small things with sharp edges."""
    for mat in bpy.data.materials:
        for node in mat.node_tree.nodes:
            if node.type in ("TEX_NOISE", "TEX_WAVE"):
                node.inputs["Detail"].default_value = 8.0
            if node.type == "TEX_WAVE":
                node.inputs["Distortion"].default_value = 3.0  # a grain rather than plain stripes
    x, y, _ = ROOM
    books(3.6, 0.72, 2.28, 2.0, 0.3, rng)  # on top of the shelf
    box("bookcase", (-x / 2 + 0.2, 0.5, 0.45), (0.4, 2.0, 0.9),
        material("bookcase", (0.5, 0.32, 0.18), texture="wave", scale=6.0))
    books(-x / 2 + 0.2, -0.48, 1.48, 0.9, 0.3, rng)
    box("chessboard", (0.9, 0.45, 0.785), (0.48, 0.48, 0.01),
        material("chessboard", (0.9, 0.88, 0.8), roughness=0.3, texture="checker", scale=8.0, dark=0.1))
    box("poster", (-x / 2 + 0.02, -1.6, 1.6), (1.2, 0.9, 0.03),  # rows of small bricks read like print
        material("poster", (0.95, 0.95, 0.9), roughness=0.8, texture="brick", scale=40.0, dark=0.15))
    bpy.context.active_object.rotation_euler = (math.pi / 2, 0.0, math.pi / 2)  # its texture's plane onto the wall
    box("mat", (2.2, -2.2, 0.005), (1.2, 0.8, 0.01),
        material("doormat", (0.4, 0.6, 0.3), roughness=0.9, texture="checker", scale=30.0, dark=0.4))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--views", type=int, default=180)
    p.add_argument("--test-every", type=int, default=9, help="every this-th view is held out")
    p.add_argument("--width", type=int, default=1920, help="the height is 9/16 of it")
    p.add_argument("--samples", type=int, default=3, help="Eevee's samples a view (anti-aliasing)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality")
    args = p.parse_args(argv)
    rng = np.random.default_rng(7)
    build_room(rng)
    poses = camera_poses(args.views, rng)  # blender_interior.py's cameras, before add_detail draws from rng
    add_detail(rng)
    scene = bpy.context.scene
    scene.world.node_tree.nodes["Background"].inputs["Strength"].default_value = 0.5  # Eevee has no bounce light
    eevee = scene.eevee
    eevee.taa_render_samples = args.samples
    eevee.use_gtao, eevee.gtao_distance = True, 0.5  # ambient occlusion in corners and under things
    eevee.use_soft_shadows = False  # soft shadows band at a few samples
    eevee.shadow_cube_size = "1024"
    r = scene.render
    r.engine = "BLENDER_EEVEE"
    r.resolution_x, r.resolution_y, r.resolution_percentage = args.width, args.width * 9 // 16, 100
    r.film_transparent = False
    r.image_settings.file_format, r.image_settings.color_mode = "JPEG", "RGB"
    r.image_settings.quality = args.quality
    scene.view_settings.view_transform = "Standard"
    render_views(DatasetWriter(args.out, extension=".jpg"), poses, args.test_every)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv[1:]))

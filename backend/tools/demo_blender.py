"""The Blender half of `./run demo`, run by `python -m backend demo` in its own process with the bpy module
(bpy and torch stay in separate processes): build a small scene of coloured meshes, build and install the
add-on, capture views with Cycles, train on a backend the add-on starts (CUDA fast preset where there is a
GPU, a short CPU schedule otherwise), then render the held-out views through the add-on's render engine.

    python -m backend.tools.demo_blender --out DIR [--size PX] [--views N] [--steps N]

Writes DIR/dataset/<session>/ (the capture, Cycles truth of the held-out views under test/), DIR/novel/*.png
(the engine's renders of the same cameras), DIR/splats.ply and DIR/blender.json for the report.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import bpy
from mathutils import Matrix

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import build_addon  # noqa: E402

ORBIT_LENS = 50.0
_timers: list = []
_register = bpy.app.timers.register


def _catch_timer(function, first_interval=0.0, persistent=False):
    """bpy as a module has no event loop: keep the add-on's timers to call them from wait()."""
    _timers.append(function)
    return _register(function, first_interval=first_interval, persistent=persistent)


bpy.app.timers.register = _catch_timer


def log(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


def wait(condition, what: str, timeout: float) -> None:
    """Run the add-on's timers (its poller applies the backend's news) until condition() holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        backend = sys.modules["splatwright"].scene.live.backend
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s (backend {backend.connection}, "
                               f"{backend.status}, last error: {backend.last_error})")
        if backend.last_error:
            raise RuntimeError(f"{what}: {backend.last_error}")
        for function in _timers:
            if bpy.app.timers.is_registered(function):
                function()
        time.sleep(0.05)


def material(name: str, rgb) -> bpy.types.Material:
    m = bpy.data.materials.new(name)
    m.use_nodes = True
    m.node_tree.nodes["Principled BSDF"].inputs["Base Color"].default_value = (*rgb, 1.0)
    return m


def build_scene(size: int) -> None:
    scene = bpy.context.scene
    scene.render.engine = "CYCLES"
    scene.cycles.device, scene.cycles.samples, scene.cycles.use_denoising = "CPU", 16, False
    scene.render.resolution_x = scene.render.resolution_y = size
    for add, name, location, rgb in (
            (lambda: bpy.ops.mesh.primitive_cube_add(size=0.9), "Box", (-0.7, -0.3, 0.45), (0.8, 0.15, 0.1)),
            (lambda: bpy.ops.mesh.primitive_uv_sphere_add(radius=0.5), "Ball", (0.6, -0.4, 0.5), (0.1, 0.3, 0.85)),
            (lambda: bpy.ops.mesh.primitive_torus_add(major_radius=0.5, minor_radius=0.15), "Ring", (0.1, 0.7, 0.3),
             (0.95, 0.75, 0.1)),
            (lambda: bpy.ops.mesh.primitive_cone_add(radius1=0.4, depth=0.9), "Cone", (0.9, 0.6, 0.45),
             (0.15, 0.7, 0.25)),
            (lambda: bpy.ops.mesh.primitive_plane_add(size=3.0), "Floor", (0.0, 0.0, 0.0), (0.7, 0.7, 0.7))):
        add()
        obj = bpy.context.active_object
        obj.name, obj.location = name, location
        obj.data.materials.append(material(name, rgb))
    sun = bpy.data.objects.new("Sun", bpy.data.lights.new("Sun", "SUN"))
    sun.data.energy, sun.rotation_euler = 3.0, (0.5, 0.3, 0.6)
    scene.collection.objects.link(sun)
    scene.world = bpy.data.worlds.new("World")
    scene.world.color = (0.3, 0.3, 0.3)
    bpy.ops.object.select_all(action="DESELECT")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.tools.demo_blender", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--size", type=int, default=None, help="image side in pixels (default: 200 on GPU, 80 on CPU)")
    p.add_argument("--views", type=int, default=48, help="captured views; every 8th is held out")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the fast preset on GPU, 800 on CPU)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    addon_zip = build_addon.build(out / "dist")
    bpy.ops.wm.read_factory_settings(use_empty=True)
    bpy.ops.preferences.addon_install(filepath=str(addon_zip), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    live = sys.modules["splatwright"].scene.live
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = sys.executable, str(out / "sessions")
    bpy.ops.splatwright.backend_start()
    wait(lambda: live.backend.connection == "connected", "backend start", 600)
    gpu = live.backend.capabilities.get("device") == "cuda"
    log(f"backend on {live.backend.capabilities.get('gpu') or 'CPU'}")

    size = args.size or (200 if gpu else 80)
    build_scene(size)
    s = bpy.context.scene.splatwright
    s.source, s.orbit_shape, s.orbit_target, s.orbit_count = "ORBIT", "HEMISPHERE", "SCENE", args.views
    s.orbit_lens, s.test_every, s.folder = ORBIT_LENS, 8, str(out / "dataset")
    s.point_count = 20000 if gpu else 3000  # the CPU reference rasterizer's time grows with the Gaussians
    start = time.monotonic()
    if bpy.ops.splatwright.capture() != {"FINISHED"}:
        raise RuntimeError(f"capture failed: {live.backend.last_error}")
    wait(lambda: not live.backend.in_flight, "views sent", 300)
    capture_seconds = time.monotonic() - start
    dataset = out / "dataset" / s.session
    log(f"captured {args.views} views at {size}x{size} with Cycles in {capture_seconds:.0f} s into {dataset}")

    s.preset = "FAST"
    if not gpu or args.steps is not None:
        s.custom_steps, s.iterations = True, args.steps or 800
    s.sh_degree, s.max_gaussians = (3, 0) if gpu else (1, 6000)
    start = time.monotonic()
    bpy.ops.splatwright.train_start()
    wait(lambda: live.backend.status.get("state") == "training", "training starts", 300)
    shown = 0
    while live.backend.status.get("state") != "finished":
        wait(lambda: live.backend.status.get("state") == "finished" or time.monotonic() - start > shown + 10,
             "training", 3600)
        shown = int(time.monotonic() - start)
        status, progress = live.backend.status, live.backend.progress
        log(f"step {status.get('step')}/{status.get('iterations')}, PSNR {progress.get('psnr') or 0:.2f} dB, "
            f"{progress.get('gaussians')} Gaussians")
    train_seconds = time.monotonic() - start
    bpy.ops.splatwright.export_splats(filepath=str(out / "splats.ply"))
    wait(lambda: not live.backend.in_flight, "PLY export", 300)

    # The held-out views through the render engine (engine.render), from the cameras Cycles rendered them with.
    scene = bpy.context.scene
    camera = bpy.data.objects.new("Novel", bpy.data.cameras.new("Novel"))
    camera.data.lens, camera.data.sensor_fit = ORBIT_LENS, "AUTO"  # the orbit camera's lens
    scene.collection.objects.link(camera)
    scene.camera, scene.render.engine = camera, "SPLATWRIGHT"
    scene.render.image_settings.file_format, scene.render.image_settings.color_mode = "PNG", "RGB"
    scene.view_settings.view_transform = "Standard"
    frames = json.loads((dataset / "transforms_test.json").read_text())["frames"]
    names, start = [], time.monotonic()
    for frame in frames:
        name = Path(frame["file_path"]).name
        camera.matrix_world = Matrix(frame["transform_matrix"])
        scene.render.filepath = str(out / "novel" / f"{name}.png")
        bpy.ops.render.render(write_still=True)
        names.append(name)
    render_seconds = time.monotonic() - start
    info = {"dataset": str(dataset), "session": s.session, "views": args.views, "size": size,
            "held_out": names, "device": "cuda" if gpu else "cpu", "gpu": live.backend.capabilities.get("gpu"),
            "steps": live.backend.status.get("step"), "gaussians": live.backend.status.get("gaussians"),
            "train_psnr": live.backend.progress.get("psnr"), "capture_seconds": round(capture_seconds, 1),
            "train_seconds": round(train_seconds, 1), "render_seconds": round(render_seconds, 2),
            "blender": bpy.app.version_string, "errors": live.backend.last_error}
    (out / "blender.json").write_text(json.dumps(info, indent=2) + "\n")

    bpy.ops.splatwright.backend_stop()
    wait(lambda: live.backend.connection == "disconnected" and not live.backend.in_flight, "backend stop", 120)
    bpy.ops.preferences.addon_disable(module="splatwright")
    return 0


if __name__ == "__main__":
    sys.exit(main())

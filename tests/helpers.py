"""Shared test helpers: small synthetic scenes and models made on the fly (no downloads, no shared data needed),
and waiting for a condition."""
from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from blender_addon.core.cameras import BLENDER_TO_OPENCV, Camera, intrinsics_from_fov_x, look_at  # noqa: E402
from backend.gaussians import Gaussians
from backend.policy import cpu_config
from backend.render import render
from backend.render.constants import NEAR_PLANE

ROOT = Path(__file__).resolve().parent.parent
DONUT = ROOT.parent / "shared" / "data" / "splats" / "donut_sh0.ply"
SKULL = ROOT / "tests" / "data" / "colmap_skull"
HOST_CXX = shutil.which("g++") or shutil.which("c++")
needs_host_cxx = pytest.mark.skipif(HOST_CXX is None, reason="no C++ compiler (g++) on PATH to build the host check")


def build_host_check(source: str, folder: Path) -> Path:
    """tests/SOURCE, a C++ program including the kernels' headers (cuda/), built for the host into `folder`
    without fused multiply-adds, as the float comparisons with the reference expect."""
    exe = folder / Path(source).stem
    build = subprocess.run([HOST_CXX, "-O2", "-std=c++17", "-ffp-contract=off", f"-I{ROOT / 'cuda'}",
                            str(ROOT / "tests" / source), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, f"the host check did not build:\n{build.stderr}"
    return exe


def orbit_cameras(n: int, width: int, height: int, radius: float = 3.0, fov_x: float = 0.9) -> list[Camera]:
    K = intrinsics_from_fov_x(fov_x, width, height)
    cams = []
    for i in range(n):
        az = 2 * math.pi * i / n
        eye = [radius * math.cos(az), radius * math.sin(az), 0.8 + 0.3 * math.sin(3 * az)]
        cams.append(Camera(look_at(eye, [0, 0, 0]), K, width, height))
    return cams


MIXED_SIZES = [(32, 30), (32, 31), (31, 32)]  # (width, height) of the views of conftest's mixed_size_scene


def cameras_of_sizes(n: int, sizes: list[tuple[int, int]], radius: float = 3.0, fov_x: float = 0.9) -> list[Camera]:
    """orbit_cameras whose sizes cycle through `sizes` ((width, height) each), with one horizontal field of view,
    as undistorted photos of one camera differ by a few pixels."""
    sized = [sizes[i % len(sizes)] for i in range(n)]
    return [Camera(cam.c2w, intrinsics_from_fov_x(fov_x, w, h), w, h)
            for cam, (w, h) in zip(orbit_cameras(n, 1, 1, radius, fov_x), sized)]


def random_gaussians(n: int, seed: int = 0, sh_degree: int = 3, scale: float = 0.08) -> Gaussians:
    gen = torch.Generator().manual_seed(seed)
    g = Gaussians.random_in_box(n, [0, 0, 0], 0.8, sh_degree, seed)
    g.log_scales = math.log(scale) + 0.3 * torch.randn(n, 3, generator=gen)
    g.quats = torch.nn.functional.normalize(torch.randn(n, 4, generator=gen), dim=-1)
    g.opacity_logits = torch.randn(n, generator=gen)
    g.sh_rest = 0.1 * torch.randn(g.sh_rest.shape, generator=gen)
    return g


def write_scene(folder: Path, model: Gaussians, cameras: list[Camera], split: str = "train",
                background=(1.0, 1.0, 1.0), formation: str = "standard") -> Path:
    """Render `model` from `cameras` in an image formation into PNGs + a NeRF-synthetic transforms_<split>.json:
    RGBA for the standard formation, whose compositing over the background the loader repeats, and opaque views
    over `background` for the blender formation, which composites in linear light."""
    (folder / split).mkdir(parents=True, exist_ok=True)
    frames = []
    for i, cam in enumerate(cameras):
        with torch.no_grad():
            if formation == "standard":
                out = render(model, cam, model.max_sh_degree, (0.0, 0.0, 0.0))
                # Un-premultiply so the loader's compositing over the background reproduces the render.
                rgb = torch.where(out.alpha[..., None] > 0, out.image / out.alpha[..., None].clamp_min(1e-6), 0.0)
                alpha = out.alpha
            else:
                rgb = render(model, cam, model.max_sh_degree, background, formation=formation).image
                alpha = torch.ones_like(rgb[..., 0])
        rgba = torch.cat([rgb.clamp(0, 1), alpha[..., None]], dim=-1)
        Image.fromarray((rgba.numpy() * 255 + 0.5).astype(np.uint8), "RGBA").save(folder / split / f"r_{i}.png")
        frames.append({"file_path": f"./{split}/r_{i}",
                       "transform_matrix": (cam.c2w @ BLENDER_TO_OPENCV).tolist()})
    fov_x = 2 * math.atan(0.5 * cameras[0].width / cameras[0].K[0, 0])
    path = folder / f"transforms_{split}.json"
    path.write_text(json.dumps({"camera_angle_x": fov_x, "frames": frames}))
    return path


def viewing_model(folder: Path) -> tuple[Gaussians, Path]:
    """The small model the Blender engine tests view, and its PLY in `folder`."""
    from backend.formats.ply import write_ply
    model = random_gaussians(400, seed=3, sh_degree=1)
    model.means *= 1.5
    write_ply(folder / "model.ply", model)
    return model, folder / "model.ply"


def moving_model(n: int = 80, seed: int = 6):
    """A small 4D model whose Gaussians move, turn and fade in and out."""
    from backend.dynamic import DynamicGaussians
    model = DynamicGaussians.from_static(random_gaussians(n, seed=seed, sh_degree=1, scale=0.12))
    gen = torch.Generator().manual_seed(seed)
    model.velocities = 0.6 + 0.2 * torch.randn(n, 3, generator=gen)
    model.accelerations = 0.3 * torch.randn(n, 3, generator=gen)
    model.angular_velocities = torch.randn(n, 3, generator=gen)
    model.time_precisions = 2.0 * torch.rand(n, generator=gen)
    return model


def assert_same_model(a: Gaussians, b: Gaussians, atol: float = 0.0) -> None:
    assert type(a) is type(b) and a.names() == b.names()
    for name in a.names():
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=atol, rtol=0.0 if atol == 0 else 1e-5,
                                   msg=name)


def spawned_workers(pid: int) -> list[int]:
    """The processes `pid`'s threads spawned with multiprocessing (training processes of `--gpus`, not its resource
    tracker)."""
    children = [c for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def wait_until(condition, timeout=60.0):
    """Wait for `condition`; the timeout only ends a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "hung: the condition never came true"
        time.sleep(0.005)


# ---- COLMAP captures ----

MODEL_IDS = {"SIMPLE_PINHOLE": 0, "PINHOLE": 1, "SIMPLE_RADIAL": 2, "OPENCV": 4, "FOV": 7}


def matrix_to_quat(R: np.ndarray) -> np.ndarray:
    """(w, x, y, z) with w >= 0 of a rotation matrix (Shepperd's method)."""
    t = np.trace(R)
    if t > 0:
        s = 2 * math.sqrt(1 + t)
        q = [s / 4, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(R)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2 * math.sqrt(1 + R[i, i] - R[j, j] - R[k, k])
        q = [0.0] * 4
        q[0], q[1 + i] = (R[k, j] - R[j, k]) / s, s / 4
        q[1 + j], q[1 + k] = (R[j, i] + R[i, j]) / s, (R[k, i] + R[i, k]) / s
    q = np.array(q)
    return q if q[0] >= 0 else -q


def write_capture(root: Path, cameras: list[Camera], binary: bool, model: str = "PINHOLE", folder: str = "sparse/0",
                  n_points: int = 60) -> dict:
    """Render a random model from `cameras` into root/images and write the COLMAP model of the capture."""
    g = random_gaussians(150, seed=2, sh_degree=1)
    (root / "images").mkdir(parents=True, exist_ok=True)
    names = [f"frame_{i:03d}" for i in range(len(cameras))]
    for cam, name in zip(cameras, names):
        with torch.no_grad():
            image = render(g, cam, 1, (1.0, 1.0, 1.0)).image
        Image.fromarray((image.clamp(0, 1).numpy() * 255 + 0.5).astype(np.uint8)).save(root / "images" / f"{name}.png")
    # One COLMAP camera (ids from 1) per distinct size and intrinsics, shared by the images that have them.
    declared: dict[tuple, int] = {}
    camera_ids = [declared.setdefault((cam.width, cam.height, *cam.K.flat), len(declared) + 1) for cam in cameras]
    entries = []  # (width, height, parameters) of each declared camera, in id order
    for w, h, *k in declared:
        K = np.reshape(k, (3, 3))
        entries.append((w, h, {"PINHOLE": [K[0, 0], K[1, 1], K[0, 2], K[1, 2]],
                               "SIMPLE_PINHOLE": [K[0, 0], K[0, 2], K[1, 2]],
                               "SIMPLE_RADIAL": [K[0, 0], K[0, 2], K[1, 2], 0.01],
                               "OPENCV": [K[0, 0], K[1, 1], K[0, 2], K[1, 2], 0.01, 0, 0, 0],
                               "FOV": [K[0, 0], K[1, 1], K[0, 2], K[1, 2], 0.01]}[model]))
    xyz = g.means[:n_points].numpy().astype(np.float64)
    rgb = np.random.default_rng(0).integers(0, 256, (n_points, 3))
    observations = [cam.world_to_pixel(xyz)[0] for cam in cameras]  # every point seen in every image
    out = root / folder
    out.mkdir(parents=True, exist_ok=True)
    poses = []
    for cam in cameras:
        w2c = cam.w2c
        poses.append((matrix_to_quat(w2c[:3, :3]), w2c[:3, 3]))
    # Images listed out of name order, with ids that are not positions, as COLMAP's may be.
    order = list(range(len(cameras)))[::-1]
    if binary:
        with open(out / "cameras.bin", "wb") as f:
            f.write(struct.pack("<Q", len(entries)))
            for camera_id, (w, h, params) in enumerate(entries, 1):
                f.write(struct.pack("<iiQQ", camera_id, MODEL_IDS[model], w, h))
                f.write(struct.pack(f"<{len(params)}d", *params))
        with open(out / "images.bin", "wb") as f:
            f.write(struct.pack("<Q", len(cameras)))
            for i in order:
                q, t = poses[i]
                f.write(struct.pack("<i7di", 100 + i, *q, *t, camera_ids[i]) + f"{names[i]}.png".encode() + b"\0")
                f.write(struct.pack("<Q", n_points))
                for p, (x, y) in enumerate(observations[i]):
                    f.write(struct.pack("<ddq", x, y, p + 1))
        with open(out / "points3D.bin", "wb") as f:
            f.write(struct.pack("<Q", n_points))
            for p in range(n_points):
                f.write(struct.pack("<Q3d3BdQ", p + 1, *xyz[p], *rgb[p], 0.5, len(cameras)))
                f.write(b"".join(struct.pack("<ii", 100 + i, p) for i in range(len(cameras))))
    else:
        (out / "cameras.txt").write_text("# Camera list with one line of data per camera:\n" + "".join(
            f"{camera_id} {model} {w} {h} {' '.join(map(repr, params))}\n"
            for camera_id, (w, h, params) in enumerate(entries, 1)))
        lines = ["# Image list with two lines of data per image:"]
        for i in order:
            q, t = poses[i]
            lines.append(f"{100 + i} {' '.join(map(repr, [*q, *t]))} {camera_ids[i]} {names[i]}.png")
            lines.append(" ".join(f"{x!r} {y!r} {p + 1}" for p, (x, y) in enumerate(observations[i])))
        (out / "images.txt").write_text("\n".join(lines) + "\n")
        (out / "points3D.txt").write_text("# 3D point list\n" + "".join(
            f"{p + 1} {' '.join(map(repr, xyz[p]))} {' '.join(map(str, rgb[p]))} 0.5 "
            + " ".join(f"{100 + i} {p}" for i in range(len(cameras))) + "\n" for p in range(n_points)))
    return {"names": names, "xyz": xyz, "rgb": rgb, "observations": observations}


# ---- hostile splat files: each declares or inflates to far more than it holds ----

def gzip_of_zeros(count: int, prefix: bytes = b"") -> bytes:
    """A gzip stream of `prefix` then `count` zero bytes, compressed a MiB at a time (about 1000:1)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    parts = [z.compress(prefix)] + [z.compress(block) for _ in range(count // len(block))]
    return b"".join(parts + [z.compress(bytes(count % len(block))), z.flush()])


def spz_of_zeros(splats: int, zeros: int, sh_degree: int = 3, version: int = 3) -> bytes:
    """A gzip'd SPZ whose header declares `splats` splats, followed by `zeros` zero bytes (all-zero columns are a
    valid model where `zeros` is what the count needs)."""
    from backend.formats.spz import LEGACY_HEADER, MAGIC
    return gzip_of_zeros(zeros, LEGACY_HEADER.pack(MAGIC, version, splats, sh_degree, 12, 0, 0))


def spz_column_bytes(splats: int, sh_degree: int = 3) -> int:
    """Bytes of a version 3 SPZ's columns for `splats` splats."""
    return splats * (9 + 1 + 3 + 3 + 4 + 3 * ((sh_degree + 1) ** 2 - 1))


def zstd_spz_of_zeros(splats: int, inflated: int | None = None) -> bytes:
    """A version 4 SPZ (SH degree 0) whose zstd streams each inflate to the zeros its columns need; the first
    to `inflated` zeros instead, where given (its table still says what the columns need)."""
    import zstandard
    from backend.formats.spz import MAGIC, NGSP_HEADER
    sizes = [9 * splats, splats, 3 * splats, 3 * splats, 4 * splats]
    streams = []
    for i, size in enumerate(sizes):
        size = inflated if i == 0 and inflated is not None else size
        z = zstandard.ZstdCompressor(level=3).compressobj()
        block = bytes(min(size, 1 << 22))
        parts = [z.compress(block) for _ in range(size // len(block))]
        streams.append(b"".join(parts + [z.compress(bytes(size % len(block))), z.flush()]))
    header = NGSP_HEADER.pack(MAGIC, 4, splats, 0, 12, 0, len(sizes), NGSP_HEADER.size)
    table = b"".join(struct.pack("<QQ", len(stream), size) for stream, size in zip(streams, sizes))
    return header + table + b"".join(streams)


def ray_parameters(proj) -> torch.Tensor:
    """The kernels' ray parameters of the reference's RayProjected splats (cuda/rays.cuh's ray_parameters), (N,
    10): in each splat's unit frame its centre m, s = 1 / its view depth (the ray through the projected centre is
    s m there), and N0, N1, how a pixel's ray changes there per pixel in x and in y (the frame's first two columns
    over fx and fy)."""
    fx, fy = proj.intrinsics[:2]
    s = 1 / torch.where(proj.depths > NEAR_PLANE, proj.depths, torch.ones_like(proj.depths))
    return torch.cat([proj.centres, s[:, None], proj.frames[:, :, 0] / fx, proj.frames[:, :, 1] / fy], dim=-1)


def formation_config(iterations: int, formation: str):
    """A short CPU training of 300 random Gaussians (at most 800) in an image formation."""
    cfg = cpu_config(iterations)
    return replace(cfg, init_points=300, sh_interval=40, log_every=10, image_formation=formation,
                   densify=replace(cfg.densify, start=10, every=10, stop=iterations, reset_opacity_every=0,
                                   max_gaussians=800))


def x_display(width: int, height: int):
    """A generator for a fixture: an Xvfb display of width x height (its name, ":N"), ended after; skips where
    Debian's blender or Xvfb is missing, or Xvfb does not start."""
    if not (shutil.which("blender") and shutil.which("Xvfb")):
        pytest.skip("Debian's blender or Xvfb is not installed (apt-get install blender xvfb python3-numpy); "
                    "the windowed tests need both")
    read, write = os.pipe()
    server = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", f"{width}x{height}x24",
                               "-nolisten", "tcp"], pass_fds=(write,), stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as pipe:
        display = pipe.readline().strip()  # Xvfb picks a free display and names it here once it listens
    if not display:
        server.kill()
        pytest.skip("Xvfb did not start")
    yield f":{display}"
    server.terminate()
    server.wait(10)


_CLI_MEMORY = """
import contextlib, io, json, sys, time
from backend.tools import cli

def resident(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024

runs = []
for argv in json.loads(sys.argv[1]):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from what is resident now
    ready, err, start = resident("VmRSS"), io.StringIO(), time.monotonic()
    with contextlib.redirect_stderr(err):
        code = cli.main(argv)
    runs.append({"code": code, "stderr": err.getvalue(), "rise": resident("VmHWM") - ready,
                 "seconds": time.monotonic() - start})
print(json.dumps(runs))
"""


def cli_memory(*runs: list[str]) -> list[dict]:
    """Each command line of `runs` run by the CLI in turn in one fresh process (a traceback fails the test): its exit
    code, its stderr, its seconds and how far its peak resident memory rose above what the process held before
    it (Linux: VmHWM, reset before each run)."""
    r = subprocess.run([sys.executable, "-c", _CLI_MEMORY, json.dumps(list(runs))], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_bombs_refused(files: dict[str, tuple[bytes, str]], folder: Path, rise: int) -> None:
    """Each file of `files` (name -> (its bytes, what its refusal says)), written into `folder`, is refused by
    `convert` in one line naming it and saying so, within `rise` bytes of peak memory, writing nothing; each holds
    under 2 MiB (what it declares or inflates to is far more). How fast: `bench/results/hardening-bombs-*.md`."""
    for name, (data, _) in files.items():
        (folder / name).write_bytes(data)
    runs = cli_memory(*(["convert", str(folder / name), str(folder / "out.ply")] for name in files))
    for (name, (data, said)), run in zip(files.items(), runs):
        lines = run["stderr"].strip().splitlines()
        assert run["code"] == 1 and len(lines) == 1 and lines[0].startswith(f"error: {folder / name}"), (name, run)
        assert said in lines[0], (name, lines[0])
        assert run["rise"] < rise, (name, run)
        assert len(data) < 2 << 20
    assert not (folder / "out.ply").exists()


def simple_radial_capture(folder: Path) -> Path:
    """The skull's photos with its model's camera made SIMPLE_RADIAL (a small k), as `colmap mapper` leaves a
    capture; made with pycolmap."""
    import pycolmap  # only the tests that make a distorted model need it, and they skip without it
    shutil.copytree(SKULL / "images", folder / "images")
    model = pycolmap.Reconstruction(str(SKULL / "sparse"))
    fx, fy, cx, cy = model.cameras[1].params
    model.cameras[1].model = pycolmap.CameraModelId.SIMPLE_RADIAL
    model.cameras[1].params = [(fx + fy) / 2, cx, cy, 0.02]
    (folder / "sparse" / "0").mkdir(parents=True)
    model.write(str(folder / "sparse" / "0"))
    return folder

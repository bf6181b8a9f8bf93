"""Structure from motion from a video against the exact cameras, and the far-field start: a textured object on a
textured ground under a smooth sky, drawn by the reference renderer along a smooth orbit and encoded as H.264,
goes through `photos` (every frame registered; every TEST_EVERY-th held out of training and scored) and trains on
the CPU three times:

- sfm: on the structure from motion's cameras and points, with the far-field start (a COLMAP capture's default);
- exact: on the same frames with the cameras they were drawn from, from the same points and far field, aligned
  to those cameras by the similarity of the camera centres;
- sfm, no far field: as sfm, without it.

Bars: sfm within EXACT_GAP_DB of exact and at least MIN_PSNR held out; the far field above none.

With --surface-points N, no video: the exact cameras, the frames drawn at the training size, and N points drawn
from the ball's and the ground's Gaussians in their colours (the surfaces structure from motion finds), trained
with and without the far field. Bar: the far field above none.

    python -m backend bench video [--steps N] [--downscale D] [--surface-points N] [--out DIR] [--keep DIR]

Writes video-<date>.json and .md into --out (default bench/results); exits 1 when a bar is missed.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from blender_addon.core.colmap import TEST_EVERY
from blender_addon.core.settings import FAR_FIELD_POINTS
from ...data import colmap, load_split
from ...data.dataset import Dataset
from ...data.images import load_rgb, quantise, resized
from ...data.photos import reconstruct, similarity
from ...data.video import FRAMES
from ...gaussians import Gaussians, rgb_to_sh_dc, with_far_field
from ...sh import SH_C0
from ...policy import cpu_config
from ...render import render
from ...service.limits import Limits
from ...train import Trainer, evaluate
from ..progress import Progress, StageProgress
from . import RESULTS, git_commit, train_until, write_results

WIDTH, HEIGHT = 384, 288  # the video's frames
FRAME_COUNT = 48  # one turn around the object
FPS = 8  # the video's rate, and the rate its frames are taken at: every frame
EXACT_GAP_DB = 1.0
MIN_PSNR = 25.0
SURFACE = 13_000  # textured_scene's first Gaussians: the ball's and the ground's


def textured_scene(seed: int = 0) -> Gaussians:
    """A ball (radius 0.5) and a ground disc (radius 3) in colours that vary over a few scales, under a sky
    dome (radius 20) whose colour changes slowly: structure from motion finds the ball and the ground, not the
    sky."""
    rng = np.random.default_rng(seed)
    waves = rng.normal(size=(12, 3)) * rng.uniform(2.0, 40.0, (12, 1))  # wave vectors of 0.15-3 unit wavelengths
    phases, amplitudes = rng.uniform(0, 2 * np.pi, (12, 3)), rng.uniform(0.05, 0.15, (12, 3))

    def texture(xyz: np.ndarray) -> np.ndarray:
        shade = 0.5 + (amplitudes[None] * np.sin((xyz @ waves.T)[:, :, None] + phases[None])).sum(axis=1)
        return np.clip(shade + rng.uniform(-0.08, 0.08, shade.shape), 0.02, 0.98)

    ball = rng.normal(size=(5000, 3))
    ball = 0.5 * ball / np.linalg.norm(ball, axis=1, keepdims=True) + [0.0, 0.0, 0.5]
    radius, angle = 3.0 * np.sqrt(rng.uniform(size=8000)), rng.uniform(0, 2 * np.pi, 8000)
    ground = np.stack([radius * np.cos(angle), radius * np.sin(angle), np.zeros(8000)], axis=1)
    sky = rng.normal(size=(400, 3))
    sky = 20.0 * sky / np.linalg.norm(sky, axis=1, keepdims=True)
    elevation = np.clip(sky[:, 2] / 20.0, 0.0, 1.0)[:, None]
    sky_colour = (1 - elevation) * [0.85, 0.88, 0.92] + elevation * [0.35, 0.55, 0.85]
    sky_colour += 0.05 * np.sin(np.arctan2(sky[:, 1], sky[:, 0]))[:, None] * [1.0, 0.6, 0.2]
    means = np.concatenate([ball, ground, sky])
    colours = np.concatenate([texture(ball), texture(ground), sky_colour])
    scales = np.concatenate([np.full((5000, 3), 0.025), np.tile([0.045, 0.045, 0.004], (8000, 1)),
                             np.full((400, 3), 3.0)])
    n = len(means)
    quats = torch.zeros(n, 4)
    quats[:, 0] = 1.0
    return Gaussians(means=torch.tensor(means, dtype=torch.float32),
                     log_scales=torch.tensor(np.log(scales), dtype=torch.float32), quats=quats,
                     opacity_logits=torch.full((n,), 4.0),
                     sh_dc=rgb_to_sh_dc(torch.tensor(colours, dtype=torch.float32))[:, None, :],
                     sh_rest=torch.zeros(n, 0, 3))


def orbit(count: int = FRAME_COUNT, width: int = WIDTH, height: int = HEIGHT) -> list[Camera]:
    """One smooth turn around the ball, rising and falling a little, looking at it."""
    K = intrinsics_from_fov_x(0.9, width, height)
    cameras = []
    for i in range(count):
        az = 2 * math.pi * i / count
        eye = [3.2 * math.cos(az), 3.2 * math.sin(az), 1.3 + 0.3 * math.sin(2 * az)]
        cameras.append(Camera(look_at(eye, [0.0, 0.0, 0.4]), K, width, height))
    return cameras


def draw(model: Gaussians, cameras: list[Camera]) -> list[np.ndarray]:
    """The frames (uint8 (H, W, 3)) the cameras see."""
    frames = []
    with torch.no_grad():
        for cam in cameras:
            image = render(model, cam, 0, (1.0, 1.0, 1.0)).image.clamp(0, 1)
            frames.append((image.numpy() * 255 + 0.5).astype(np.uint8))
    return frames


def encode(frames: list[np.ndarray], path: Path, fps: int = FPS) -> Path:
    """An H.264 video of the frames, nearly lossless."""
    import av
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps, options={"crf": "12", "preset": "fast"})
        stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        for pixels in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return path


def frame_index(name: str, fps: int = FPS) -> int:
    """The index of the frame a taken frame's name (its time in milliseconds) stands for."""
    return round(int(name) * fps / 1000)


def exact_split(capture: Path, sfm: Dataset, cameras: list[Camera], downscale: float) -> Dataset:
    """The views of `sfm`, as the frames taken from the video with the cameras they were drawn from."""
    chosen, images = [], []
    for name in sfm.names:
        cam = cameras[frame_index(name)].scaled(1 / downscale)
        rgb = load_rgb(capture / FRAMES / f"{name}.jpg", (1.0, 1.0, 1.0))
        chosen.append(cam)
        images.append(quantise(resized(rgb, cam.width, cam.height)))
    return Dataset(chosen, images, list(sfm.names))


def aligned_points(xyz: np.ndarray, sfm: list[Dataset], exact: list[Dataset]) -> np.ndarray:
    """The structure from motion's points moved into the exact cameras' frame by the similarity that takes its
    camera centres closest to theirs."""
    source = np.stack([cam.position for data in sfm for cam in data.cameras])
    target = np.stack([cam.position for data in exact for cam in data.cameras])
    scale, rotation, shift = similarity(source, target)
    return scale * xyz @ rotation.T + shift


def train(data: Dataset, test: Dataset, xyz: np.ndarray, rgb: np.ndarray, far: int, steps: int,
          label: str) -> dict:
    """Train on `data` from the points (and `far` far-field points) on the CPU; the held-out scores."""
    cfg = cpu_config(steps)
    xyz, rgb = with_far_field(xyz, rgb, data.cameras, data.images, far, cfg.seed)
    trainer = Trainer(data, cfg, "cpu", Gaussians.from_point_cloud(xyz, rgb, cfg.sh_degree, "cpu"))
    bar = Progress(cfg.iterations, label)
    start = time.monotonic()
    train_until(trainer, cfg.iterations, bar)
    bar.close()
    scores = evaluate(trainer.g, test, trainer.sh_degree, cfg.background, "reference")
    return {"psnr": scores["psnr"], "ssim": scores["ssim"], "gaussians": len(trainer.g),
            "seconds": time.monotonic() - start}


def surface_runs(points: int, steps: int, downscale: float) -> tuple[dict, dict]:
    """The far field against none on the exact cameras, from `points` of the scene's surfaces (--surface-points);
    (the runs, what they ran on)."""
    model = textured_scene()
    cameras = orbit(FRAME_COUNT, round(WIDTH / downscale), round(HEIGHT / downscale))
    images = [torch.from_numpy(frame) for frame in draw(model, cameras)]
    held = [i % TEST_EVERY == 0 for i in range(FRAME_COUNT)]
    split = [Dataset([c for c, h in zip(cameras, held) if h == test], [im for im, h in zip(images, held) if h == test],
                     [str(i) for i, h in enumerate(held) if h == test]) for test in (False, True)]
    chosen = np.random.default_rng(1).choice(SURFACE, points, replace=False)
    xyz = model.means[chosen].numpy()
    rgb = (model.sh_dc[chosen, 0].numpy() * SH_C0 + 0.5).clip(0, 1) * 255 + 0.5
    runs = {"far_field": train(split[0], split[1], xyz, rgb.astype(np.uint8), FAR_FIELD_POINTS, steps, "far field"),
            "no_far_field": train(split[0], split[1], xyz, rgb.astype(np.uint8), 0, steps, "no far field")}
    return runs, {"train_views": len(split[0]), "test_views": len(split[1]), "train_size": [cameras[0].width,
                                                                                             cameras[0].height]}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench video", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=600, help="training steps of each run")
    p.add_argument("--downscale", type=float, default=4.0, help="training and scoring size: the frames' / D")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--keep", type=Path, help="keep the video and the reconstruction in this folder")
    p.add_argument("--surface-points", type=int, help="no video: the far field on the exact cameras from this many "
                   "points of the scene's surfaces")
    args = p.parse_args(argv)
    if args.surface_points:
        return surface_main(args)
    work = args.keep or Path(tempfile.mkdtemp(prefix="splatwright-bench-video-"))
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    cameras = orbit()
    started = time.monotonic()
    video = encode(draw(textured_scene(), cameras), work / "orbit.mp4")
    drawn = time.monotonic() - started
    progress = StageProgress()
    result = reconstruct(video, work / "capture", Limits().check, progress, rate=FPS)
    progress.close()
    capture = result.folder
    sfm = [load_split(capture, split, downscale=args.downscale) for split in ("train", "test")]
    exact = [exact_split(capture, data, cameras, args.downscale) for data in sfm]
    xyz, rgb = colmap.read_points(capture)
    runs = {
        "sfm": train(sfm[0], sfm[1], xyz, rgb, FAR_FIELD_POINTS, args.steps, "sfm"),
        "exact": train(exact[0], exact[1], aligned_points(xyz, sfm, exact), rgb, FAR_FIELD_POINTS, args.steps,
                       "exact cameras"),
        "sfm_no_far_field": train(sfm[0], sfm[1], xyz, rgb, 0, args.steps, "sfm, no far field"),
    }
    passed = {"sfm_near_exact": runs["sfm"]["psnr"] >= runs["exact"]["psnr"] - EXACT_GAP_DB,
              "sfm_psnr": runs["sfm"]["psnr"] >= MIN_PSNR,
              "far_field_helps": runs["sfm"]["psnr"] > runs["sfm_no_far_field"]["psnr"]}
    now = datetime.datetime.now(datetime.timezone.utc)
    size = (sfm[0].cameras[0].width, sfm[0].cameras[0].height)
    out = {"benchmark": "video", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
           "frames": FRAME_COUNT, "frame_size": [WIDTH, HEIGHT], "registered": result.registered,
           "points": result.points, "sfm_seconds": result.seconds, "draw_seconds": drawn,
           "train_views": len(sfm[0]), "test_views": len(sfm[1]), "train_size": list(size), "steps": args.steps,
           "far_field": FAR_FIELD_POINTS, "threads": torch.get_num_threads(),
           "load_average": [load_before, os.getloadavg()[0]], "runs": runs, "bars": passed}
    report = "\n".join([
        f"Video to structure from motion to training (CPU), {FRAME_COUNT} frames of {WIDTH}x{HEIGHT} at {FPS} a "
        f"second, commit {out['commit']}, {out['date']}, {out['threads']} threads (1-minute load average "
        f"{load_before:.1f} before, {out['load_average'][1]:.1f} after)", "",
        f"Structure from motion: {result.registered} of {result.photos} frames registered, {result.points} points, "
        f"stages {result.seconds} s. Training: {len(sfm[0])} views, {len(sfm[1])} held out (registered with the "
        f"rest), at {size[0]}x{size[1]}, {args.steps} steps; far field {FAR_FIELD_POINTS} points.", "",
        "| run | held-out PSNR | SSIM | Gaussians | train s |", "|---|---:|---:|---:|---:|",
        *[f"| {name} | {r['psnr']:.2f} | {r['ssim']:.3f} | {r['gaussians']} | {r['seconds']:.0f} |"
          for name, r in runs.items()], "",
        f"Bars: sfm within {EXACT_GAP_DB} dB of exact: {passed['sfm_near_exact']}; sfm at least {MIN_PSNR} dB: "
        f"{passed['sfm_psnr']}; far field above none: {passed['far_field_helps']}."])
    write_results(args.out, f"video-{now.strftime('%Y%m%d-%H%M')}", out, report)
    return 0 if all(passed.values()) else 1


def surface_main(args) -> int:
    load_before = os.getloadavg()[0]
    runs, ran = surface_runs(args.surface_points, args.steps, args.downscale)
    now = datetime.datetime.now(datetime.timezone.utc)
    out = {"benchmark": "video", "mode": "surface points", "date": now.strftime("%Y-%m-%d %H:%M UTC"),
           "commit": git_commit(), "frames": FRAME_COUNT, "surface_points": args.surface_points, **ran,
           "steps": args.steps, "far_field": FAR_FIELD_POINTS, "threads": torch.get_num_threads(),
           "load_average": [load_before, os.getloadavg()[0]], "runs": runs}
    report = "\n".join([
        f"The far-field start on the exact cameras (CPU), {FRAME_COUNT} views of the textured scene drawn at "
        f"{ran['train_size'][0]}x{ran['train_size'][1]}, {ran['train_views']} trained on and {ran['test_views']} "
        f"held out, from {args.surface_points} points of the ball and the ground, {args.steps} steps; commit "
        f"{out['commit']}, {out['date']}, {out['threads']} threads (1-minute load average {load_before:.1f} before, "
        f"{out['load_average'][1]:.1f} after)", "",
        "| run | held-out PSNR | SSIM | Gaussians | train s |", "|---|---:|---:|---:|---:|",
        *[f"| {name} | {r['psnr']:.2f} | {r['ssim']:.3f} | {r['gaussians']} | {r['seconds']:.0f} |"
          for name, r in runs.items()]])
    write_results(args.out, f"video-surface-{now.strftime('%Y%m%d-%H%M')}", out, report)
    return 0 if runs["far_field"]["psnr"] > runs["no_far_field"]["psnr"] else 1

"""Peak GPU memory of training on many full-HD views; the bar: 300 views at 1920x1080 train within 8 GB.

    python -m backend bench memory [--views 300] [--width 1920] [--height 1080] [--steps 3000]
                                   [--preset quality] [--model PLY|random] [--out DIR]

It renders a model (the third-party donut PLY in ../shared/data/splats by default, or a random one) with the
CUDA rasterizer from orbit cameras around it, storing each view as uint8 on the GPU as it is rendered (as the
dataset keeps views: backend/data/dataset.py), then trains the preset's schedule from the model's points
(positions and colours, SH degree 0, as from a point cloud) for its first --steps steps and reports the peak of
torch.cuda.max_memory_allocated over the training, from the trainer's construction on, the views included.
Writes memory-<date>-<device>.json and .md into --out (default bench/results); exits 1 when the peak is over
the bar.
"""
from __future__ import annotations

import argparse
import datetime
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from ...data.dataset import Dataset
from ...data.images import quantise
from ...formats import read_any
from ...gaussians import Gaussians
from ...policy import PRESETS
from ...render import render
from ...sh import SH_C0
from ...train import Trainer, evaluate, fit_to_views
from ..progress import Progress
from . import RESULTS, ROOT, git_commit, model_extent, train_until, write_results

DONUT = ROOT.parent / "shared" / "data" / "splats" / "donut_sh0.ply"
BAR_GB = 8.0  # 1e9 bytes
FOV_X = 0.8  # radians


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench memory", description=__doc__.split("\n")[0])
    p.add_argument("--views", type=int, default=300)
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--steps", type=int, default=3000, help="train this many steps of the preset's schedule")
    p.add_argument("--preset", default="quality", choices=sorted(PRESETS))
    p.add_argument("--model", default=str(DONUT) if DONUT.is_file() else "random",
                   help="a splat file to render the views from, or 'random' (random Gaussians in a cube; "
                        "default: the donut PLY where ../shared/data has it)")
    p.add_argument("--points", type=int, default=200_000, help="Gaussians of the random model")
    p.add_argument("--bar-gb", type=float, default=BAR_GB, help="the peak allowed, in GB (1e9 bytes)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if min(args.views, args.width, args.height, args.steps) < 1:
        p.error("--views, --width, --height and --steps must be positive")
    if not torch.cuda.is_available():
        print("bench memory needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 1

    model, source = load_model(args.model, args.points)
    cameras = orbit_cameras(model, args.views, args.width, args.height)
    cfg = fit_to_views(replace(PRESETS[args.preset], rasterizer="cuda"), len(cameras))  # as it runs on them
    steps = min(args.steps, cfg.iterations)
    start = time.perf_counter()
    images = render_views(model, cameras, cfg.background)
    render_seconds = time.perf_counter() - start
    xyz = model.means.detach().cpu().numpy()
    rgb = (255 * (0.5 + SH_C0 * model.sh_dc[:, 0].detach()).clamp(0, 1) + 0.5).to(torch.uint8).cpu().numpy()
    del model
    data = Dataset(cameras, images, [f"view_{i:03d}" for i in range(len(cameras))])

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    trainer = Trainer(data, cfg, "cuda", Gaussians.from_point_cloud(xyz, rgb, cfg.sh_degree, "cuda"))
    initial_gaussians = len(trainer.g)
    bar = Progress(steps, "training")
    start = time.perf_counter()
    train_until(trainer, steps, bar)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    bar.close()
    peak, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    every = max(1, len(data) // 10)
    sample = Dataset(data.cameras[::every], data.images[::every], data.names[::every])
    scores = evaluate(trainer.g, sample, trainer.sh_degree, cfg.background, "cuda")

    now = datetime.datetime.now(datetime.timezone.utc)
    device = torch.cuda.get_device_name()
    stored = sum(image.numel() for image in data.images)  # one byte each
    result = {
        "benchmark": "memory", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
        "device": device, "model": source, "views": len(data), "size": [args.width, args.height],
        "views_bytes": stored, "views_float32_bytes": stored * 4, "preset": args.preset, "steps": trainer.step,
        "preset_steps": cfg.iterations, "densify_stop": cfg.densify.stop, "render_seconds": render_seconds,
        "train_seconds": seconds, "initial_gaussians": initial_gaussians, "gaussians": len(trainer.g),
        "allocated_before_bytes": before, "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved,
        "bar_gb": args.bar_gb, "within_bar": peak <= args.bar_gb * 1e9, "last_loss": trainer.last["loss"],
        "train_view_psnr": scores["psnr"], "train_view_ssim": scores["ssim"], "scored_views": len(sample)}
    write_results(args.out, f"memory-{now:%Y%m%d-%H%M}-{device.replace(' ', '_')}", result, report(result))
    return 0 if result["within_bar"] else 1


def load_model(name: str, points: int) -> tuple[Gaussians, str]:
    """The model to render the views from, on the GPU, and what it is."""
    if name == "random":
        gen = torch.Generator().manual_seed(0)
        xyz = (2 * torch.rand(points, 3, generator=gen) - 1).numpy()
        rgb = (torch.rand(points, 3, generator=gen) * 255).to(torch.uint8).numpy()
        return Gaussians.from_point_cloud(xyz, rgb, 0, "cuda"), f"random, {points} Gaussians"
    g = read_any(name)
    return g.to("cuda"), f"{Path(name).name}, {len(g)} Gaussians"


def orbit_cameras(g: Gaussians, views: int, width: int, height: int) -> list[Camera]:
    """Cameras on a spiral over the model's upper half (elevations 5 to 65 degrees, golden-angle steps in
    azimuth), looking at its centre from where the model's extent fills the frame's height."""
    center, radius = model_extent(g.means, 0.98)
    K = intrinsics_from_fov_x(FOV_X, width, height)
    distance = 1.2 * radius / (0.5 * height / K[1, 1])  # half the frame height sees 1.2 x the radius
    cameras = []
    for i in range(views):
        elevation = math.radians(5 + 60 * i / max(1, views - 1))
        azimuth = i * math.pi * (3 - math.sqrt(5))
        direction = np.array([math.cos(elevation) * math.cos(azimuth), math.cos(elevation) * math.sin(azimuth),
                              math.sin(elevation)])
        cameras.append(Camera(look_at(center + distance * direction, center), K, width, height))
    return cameras


def render_views(g: Gaussians, cameras: list[Camera], background) -> list[torch.Tensor]:
    """Each view as uint8 (H, W, 3) on the GPU, quantised as soon as it is rendered (no float copy of all)."""
    with torch.no_grad():
        return [quantise(render(g, cam, g.max_sh_degree, background, "cuda").image) for cam in cameras]


def report(r: dict) -> str:
    gb = 1e9
    width, height = r["size"]
    verdict = "within" if r["within_bar"] else "OVER"
    return "\n".join([
        f"Peak GPU memory of training: {r['views']} views at {width}x{height} rendered from {r['model']}, preset "
        f"{r['preset']} (steps 1-{r['steps']} of {r['preset_steps']}; densification to step {r['densify_stop']}), "
        f"{r['device']}, commit {r['commit']}, {r['date']}", "",
        "| views GB (uint8) | as float32 GB | peak allocated GB | bar GB | peak reserved GB | Gaussians (start) "
        "| train s | steps/s |",
        "|---|---|---|---|---|---|---|---|",
        f"| {r['views_bytes'] / gb:.2f} | {r['views_float32_bytes'] / gb:.2f} | {r['peak_allocated_bytes'] / gb:.2f} "
        f"| {r['bar_gb']:.1f} | {r['peak_reserved_bytes'] / gb:.2f} | {r['gaussians']} ({r['initial_gaussians']}) "
        f"| {r['train_seconds']:.0f} | {r['steps'] / r['train_seconds']:.1f} |", "",
        f"Peak {verdict} the bar. Views rendered in {r['render_seconds']:.1f} s. Last training loss "
        f"{r['last_loss']:.4f}; PSNR {r['train_view_psnr']:.2f} dB, SSIM {r['train_view_ssim']:.4f} over "
        f"{r['scored_views']} of the training views."])

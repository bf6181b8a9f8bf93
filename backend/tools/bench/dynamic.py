"""`python -m backend bench dynamic --data DIR`: 4D training on a moving scene (backend/tools/bench/blender_dynamic.py
makes one) against its two references, in one run on a CUDA GPU:

- the 4D model: the dynamic preset on every training view, each at its time;
- per-frame static models (the quality to reach): one per captured time on that time's training views, with
  `--frame-preset` (quality), scored on that time's held-out cameras; their mean scores and total time;
- one static model over all frames (the floor: what a model without time makes of motion): every training
  view with its time dropped, the 4D model's schedule.

The 4D and the all-frames model are scored on the held-out cameras at the captured times (test) and at the
held-out times between them (val); each model's render rate is timed at 800x800 (the 4D model at a new time
every frame). Writes dynamic-<date>-<device>.md and .json into --out (default bench/results).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from ...data import load_split, scene_point_cloud
from ...data.dataset import Dataset
from ...gaussians import Gaussians
from ...policy import PRESETS
from ...render import camera_tensors, render
from ...train import TrainConfig, Trainer, evaluate, with_steps
from ..progress import Progress
from . import RESULTS, git_commit, train_until, write_results
from .train import measure

FPS_SIDE = 800  # the render rate is timed at FPS_SIDE x FPS_SIDE
FPS_WARMUP = 10


def views_by_time(data: Dataset) -> dict[float, list[int]]:
    """The indices of a timed dataset's views, grouped by time, earliest first."""
    if data.times is None:
        raise SplatwrightError("the views have no times: bench dynamic needs a dataset over time (D-NeRF `time`)")
    groups: dict[float, list[int]] = {}
    for i, t in enumerate(data.times):
        groups.setdefault(t, []).append(i)
    return dict(sorted(groups.items()))


def subset(data: Dataset, indices: list[int]) -> Dataset:
    """The views `indices` of a loaded dataset (its images shared, nothing read again)."""
    images = [data.images[i] for i in indices]
    times = [data.times[i] for i in indices] if data.times is not None else None
    return Dataset([data.cameras[i] for i in indices], images, [data.names[i] for i in indices], times)


def frame_sets(train: Dataset, test: Dataset, count: int | None = None) -> list[tuple[float, Dataset, Dataset]]:
    """(time, its training views without times, its held-out views) per captured time; `count` of them
    spread evenly over the times where given."""
    train_groups, test_groups = views_by_time(train), views_by_time(test)
    if set(test_groups) - set(train_groups):
        raise SplatwrightError(f"held-out times {sorted(set(test_groups) - set(train_groups))} have no training views")
    times = list(test_groups)
    if count is not None and count < len(times):
        times = [times[i] for i in sorted(set(np.linspace(0, len(times) - 1, count).round().astype(int)))]
    return [(t, replace(subset(train, train_groups[t]), times=None), subset(test, test_groups[t])) for t in times]


def check_bars(four_d: dict, per_frame: dict, static: dict) -> list[tuple[str, bool]]:
    """The bars the 4D model must clear, as (what was checked with the figures, whether it passed)."""
    psnr, frames_psnr, static_psnr = four_d["test"]["psnr"], per_frame["test"]["psnr"], static["test"]["psnr"]
    seconds, frames_seconds = four_d["seconds"], per_frame["seconds_all_frames"]
    return [
        (f"4D PSNR within 1 dB of the per-frame models' mean: {psnr:.2f} vs {frames_psnr:.2f} dB",
         psnr >= frames_psnr - 1.0),
        (f"4D training at most 1/5 of the per-frame models' total: {seconds:.0f} s vs {frames_seconds:.0f} s",
         seconds <= frames_seconds / 5),
        (f"4D at least 3 dB above one static model over all frames: {psnr:.2f} vs {static_psnr:.2f} dB",
         psnr >= static_psnr + 3.0),
        (f"4D training within 180 s: {seconds:.0f} s", seconds <= 180.0),
        (f"4D renders at least 300 fps at {FPS_SIDE}x{FPS_SIDE}: {four_d['fps']:.0f} fps", four_d["fps"] >= 300.0),
    ]


def render_fps(g: Gaussians, cam: Camera, sh_degree: int, background, rasterizer: str, frames: int) -> float:
    """Frames per second rendering `g` through `cam`, at a new time every frame (sweeping [0, 1])."""
    view = camera_tensors(cam, g.means.device)
    bg = torch.tensor(background, dtype=torch.float32, device=g.means.device)
    times = [k / max(1, frames - 1) for k in range(frames)]

    def draw(ts):
        for t in ts:
            render(g.at(t), cam, sh_degree, bg, rasterizer, view)
        if g.means.is_cuda:
            torch.cuda.synchronize()
    with torch.no_grad():
        draw(times[:FPS_WARMUP])
        start = time.perf_counter()
        draw(times)
    return frames / (time.perf_counter() - start)


def train_model(name: str, train: Dataset, cfg: TrainConfig, points, evals: dict[str, Dataset], fps_camera: Camera,
                fps_frames: int) -> dict:
    """Train on `train` (a 4D model where its views have times) from the scene's points or the trainer's random
    start, then score it on each of `evals` and time its renders."""
    init = None if points is None else Gaussians.from_point_cloud(points[1], points[2], cfg.sh_degree, "cuda")
    trainer = Trainer(train, cfg, "cuda", init)
    steps = trainer.cfg.iterations  # cfg's schedule fitted to the views
    bar = Progress(steps, name)

    seconds, peak = measure(lambda: train_until(trainer, steps, bar))
    bar.close()
    scores = {split: evaluate(trainer.g, data, trainer.sh_degree, cfg.background, cfg.rasterizer)
              for split, data in evals.items()}
    fps = render_fps(trainer.g, fps_camera, trainer.sh_degree, cfg.background, cfg.rasterizer, fps_frames)
    return {"steps": trainer.step, "seconds": seconds, **scores, "gaussians": len(trainer.g), "peak_bytes": peak,
            "fps": fps}


def per_frame_models(frames: list[tuple[float, Dataset, Dataset]], cfg: TrainConfig, points, fps_camera: Camera,
                     fps_frames: int, all_frames: int) -> dict:
    """A static model per captured time; their mean scores, Gaussians and render rate, their total time (and
    that total over `all_frames` times, from the mean, where only some were trained) and highest peak."""
    rows = [train_model(f"frame t={t:.3f} ({k + 1}/{len(frames)})", train, cfg, points, {"test": test},
                        fps_camera, fps_frames)
            for k, (t, train, test) in enumerate(frames)]
    seconds = sum(r["seconds"] for r in rows)
    return {"steps": rows[0]["steps"], "models": len(rows), "seconds": seconds,
            "seconds_all_frames": seconds / len(rows) * all_frames,
            "test": {key: float(np.mean([r["test"][key] for r in rows])) for key in ("psnr", "ssim")},
            "gaussians": round(float(np.mean([r["gaussians"] for r in rows]))),
            "peak_bytes": max(r["peak_bytes"] for r in rows), "fps": float(np.mean([r["fps"] for r in rows])),
            "frames": [{"time": t, **r} for (t, _, _), r in zip(frames, rows)]}


def report(result: dict) -> str:
    models = result["models"]
    names = {"4d": f"4D (dynamic, {models['4d']['steps']} steps)",
             "per_frame": f"per-frame static x{models['per_frame']['models']} ({result['frame_preset']}, "
                          f"{models['per_frame']['steps']} steps each; time: total)",
             "static": f"one static over all frames ({models['static']['steps']} steps)"}

    def scores(row, split):
        return f"{row[split]['psnr']:.2f} | {row[split]['ssim']:.4f}" if split in row else "- | -"
    lines = [f"bench dynamic on {result['scene']}: {result['views']['train']} training views ({result['cameras']['train']} "
             f"cameras x {result['times']} times), held out {result['views']['test']} (test) and "
             f"{result['views']['val']} between the times (val); {result['device']}, commit {result['commit']}, "
             f"{result['date']}", "",
             f"| model | train s | test PSNR | test SSIM | val PSNR | val SSIM | Gaussians | peak GB | fps {FPS_SIDE}x{FPS_SIDE} |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, name in names.items():
        row = models[key]
        lines.append(f"| {name} | {row['seconds']:.1f} | {scores(row, 'test')} | {scores(row, 'val')} | "
                     f"{row['gaussians']} | {row['peak_bytes'] / 1e9:.2f} | {row['fps']:.0f} |")
    if models["per_frame"]["models"] < result["times"]:
        lines.append(f"\nPer-frame models on {models['per_frame']['models']} of the {result['times']} times (--frames); "
                     f"their total time over all times, from the mean: {models['per_frame']['seconds_all_frames']:.0f} s.")
    if result["steps_override"]:
        lines.append(f"\nEvery model trained {result['steps_override']} steps (--steps): a smoke run, not the bars' figures.")
    lines += ["", "Bars:"] + [f"- {'pass' if bar['passed'] else 'FAIL'}: {bar['check']}" for bar in result["bars"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench dynamic", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True,
                   help="a D-NeRF-layout scene (backend/tools/bench/blender_dynamic.py)")
    p.add_argument("--frame-preset", default="quality", choices=sorted(PRESETS), help="the per-frame models' preset")
    p.add_argument("--steps", type=int, default=None, help="every model's step count (a quick smoke run)")
    p.add_argument("--frames", type=int, default=None, help="per-frame models on this many times, spread out")
    p.add_argument("--fps-frames", type=int, default=300, help="renders timed for each model's render rate")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench dynamic needs a CUDA GPU", file=sys.stderr)
        return 1
    cfg = replace(PRESETS["dynamic"], rasterizer="cuda")
    frame_cfg = replace(PRESETS[args.frame_preset], rasterizer="cuda")
    if args.steps:
        cfg, frame_cfg = with_steps(cfg, args.steps), with_steps(frame_cfg, args.steps)
    train = load_split(args.data, "train", cfg.background)
    test = load_split(args.data, "test", cfg.background)
    val = load_split(args.data, "val", cfg.background)
    if test is None:
        raise SplatwrightError(f"{args.data}: no transforms_test.json (the held-out cameras)")
    frames = frame_sets(train, test, args.frames)
    points = scene_point_cloud(args.data)
    fps_camera = test.cameras[0].scaled(FPS_SIDE / test.cameras[0].width)
    evals = {"test": test, **({"val": val} if val is not None else {})}
    times = len(views_by_time(train))

    four_d = train_model("4D", train, cfg, points, evals, fps_camera, args.fps_frames)
    per_frame = per_frame_models(frames, frame_cfg, points, fps_camera, args.fps_frames, times)
    static = train_model("static, all frames", replace(train, times=None), cfg, points, evals, fps_camera,
                         args.fps_frames)
    now = datetime.now(timezone.utc)
    device = torch.cuda.get_device_name()
    result = {"benchmark": "dynamic", "scene": args.data.resolve().name, "device": device, "commit": git_commit(),
              "date": now.strftime("%Y-%m-%d %H:%M UTC"), "times": times,
              "cameras": {"train": len(train) // times, "test": len(test) // len(views_by_time(test))},
              "views": {"train": len(train), "test": len(test), "val": len(val) if val is not None else 0},
              "initial_points": None if points is None else len(points[1]), "frame_preset": args.frame_preset,
              "steps_override": args.steps, "models": {"4d": four_d, "per_frame": per_frame, "static": static},
              "bars": [{"check": text, "passed": ok} for text, ok in check_bars(four_d, per_frame, static)]}
    write_results(args.out, f"dynamic-{now:%Y%m%d-%H%M}-{device.replace(' ', '_')}", result, report(result))
    return 0

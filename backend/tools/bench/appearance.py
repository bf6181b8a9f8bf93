"""A training setting on and off: per-photo appearance (backend/appearance.py) or the far-field start
(gaussians.far_field). The same training (the CPU schedule from the scene's points, the same steps and seeds) with
the setting on and off, scored on the held-out photos plainly and by the fitted protocol (appearance.fitted_psnr).
Appearance is compared without the far field; the far field with appearance as the capture has it by default (on
for photos, off for Blender's captures).
The bars, in the mean over the seeds: appearance's fitted PSNR at least BAR_DB above off and its plain PSNR not
below; the far field's not below off in either.

    python -m backend bench appearance --data tests/data/colmap_skull [--setting far_field] [--downscale 6]
        [--steps 300] [--seeds 0]

Writes appearance-<scene>-<date> or far-field-<scene>-<date>, .json and .md, into --out (default bench/results);
exits 1 when a bar is missed.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from blender_addon.core.settings import FAR_FIELD_POINTS, training_settings
from ...data import is_colmap, load_split, scene_point_cloud
from ...gaussians import Gaussians, with_far_field
from ...policy import device_name, make_config
from ...train import Trainer, evaluate
from ..progress import Progress
from . import RESULTS, git_commit, train_until, write_results

BAR_DB = 0.5
SETTINGS = ("appearance", "far_field")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench appearance", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True,
                   help="a COLMAP capture (the skull's 65 photos: tests/data/colmap_skull in a checkout)")
    p.add_argument("--downscale", type=float, default=6.0, help="divide the photos' sizes by this (default: 6)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="SEED")
    p.add_argument("--setting", choices=SETTINGS, default="appearance", help="the setting turned on and off")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    train = load_split(args.data, "train", downscale=args.downscale)
    test = load_split(args.data, "test", downscale=args.downscale)
    jobs = [(args.data, args.downscale, args.steps, seed, args.setting, value) for seed in args.seeds
            for value in ("off", "on")]
    # Side by side, one process a run sharing the cores (the runs are independent): each run's steps are the same
    # however the cores are shared, and the times are then each run's own share.
    with ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn"),
                             initializer=torch.set_num_threads, initargs=(1,)) as pool:
        runs = list(pool.map(train_run, *zip(*jobs)))
    mean = {a: {k: sum(r[k] for r in runs if r["value"] == a) / len(args.seeds)
                for k in ("psnr", "fitted_psnr", "ssim")} for a in ("off", "on")}
    plain, fitted = (mean["on"][k] - mean["off"][k] for k in ("psnr", "fitted_psnr"))
    fitted_bar = BAR_DB if args.setting == "appearance" else 0.0
    passed = fitted >= fitted_bar and plain >= 0.0
    now = datetime.datetime.now(datetime.timezone.utc)
    cam = train.cameras[0]
    scene = args.data.resolve().name
    result = {"benchmark": "appearance", "setting": args.setting, "date": now.strftime("%Y-%m-%d %H:%M UTC"),
              "commit": git_commit(), "device": device_name("cpu"), "threads_per_run": 1,
              "load_average": os.getloadavg()[0], "scene": scene, "size": [cam.width, cam.height],
              "train_views": len(train), "test_views": len(test), "steps": args.steps, "seeds": args.seeds,
              "runs": runs, "mean": mean, "plain_gain_db": plain, "fitted_gain_db": fitted, "bar_db": fitted_bar,
              "passed": passed}
    named = {"appearance": "Per-photo appearance", "far_field": "The far-field start"}[args.setting]
    lines = [f"{named} on and off, {scene} at {cam.width}x{cam.height} ({len(train)} training photos, "
             f"{len(test)} held out), the CPU schedule for {args.steps} steps from the scene's points, seeds "
             f"{', '.join(map(str, args.seeds))}; {result['device']}, 1 thread a run, the runs side by side; commit "
             f"{result['commit']}, {result['date']}", "",
             f"| {args.setting} | seed | plain PSNR | fitted PSNR | SSIM | Gaussians | train s |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['value']} | {r['seed']} | {r['psnr']:.2f} | {r['fitted_psnr']:.2f} | {r['ssim']:.4f} | "
              f"{r['gaussians']} | {r['seconds']:.0f} |" for r in runs]
    lines += ["", f"on - off, mean over the seeds: plain {plain:+.2f} dB, fitted {fitted:+.2f} dB (bar: fitted at "
              f"least {fitted_bar:+.1f} dB, plain at least +0.0): {'passed' if passed else 'missed'}.", "",
              "Plain: the render against the whole held-out photo. Fitted: a gain and offset per channel fitted to "
              "the photo's left half by least squares, applied to the render, PSNR on the right half alone."]
    write_results(args.out, f"{args.setting.replace('_', '-')}-{scene}-{now:%Y%m%d}", result, "\n".join(lines))
    return 0 if passed else 1


def train_run(data: Path, downscale: float, steps: int, seed: int, setting: str, value: str) -> dict:
    """One training of the CPU schedule from the scene's points with `setting` on or off (`value`), and its
    held-out scores."""
    train = load_split(data, "train", downscale=downscale)
    test = load_split(data, "test", downscale=downscale)
    appearance = value if setting == "appearance" else "auto"
    cfg = make_config("cpu", "reference", training_settings(iterations=steps, seed=seed, appearance=appearance),
                      photos=is_colmap(data))
    points = scene_point_cloud(data)
    start = None
    if points is not None:
        far = FAR_FIELD_POINTS if setting == "far_field" and value == "on" else 0
        xyz, rgb = with_far_field(points[1], points[2], train.cameras, train.images, far, cfg.seed)
        start = Gaussians.from_point_cloud(xyz, rgb, cfg.sh_degree, "cpu")
    trainer = Trainer(train, cfg, "cpu", start)
    bar = Progress(cfg.iterations, f"{setting} {value}, seed {seed}")
    began = time.monotonic()
    train_until(trainer, cfg.iterations, bar)
    seconds = time.monotonic() - began
    bar.close()
    scores = evaluate(trainer.g, test, trainer.sh_degree, cfg.background, cfg.rasterizer)
    gains = [] if trainer.appearance is None else (1 + trainer.appearance.params[:, 0]).mean(1).tolist()
    return {"value": value, "seed": seed, "seconds": seconds, "gaussians": len(trainer.g), "mean_gains": gains,
            **scores}

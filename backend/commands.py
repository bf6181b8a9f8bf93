"""The CLI's commands (train, render, info); each takes parsed arguments and returns an exit code."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.points import POINTS_FILE, read_points
from blender_addon.core.settings import TRAINING
from .data import Dataset, load_cameras, load_split, parse_background
from .gaussians import Gaussians
from .ply import read_ply, write_ply
from .policy import CHECKPOINT, device_name, make_config, resolve_device, system_report
from .progress import Progress
from .render import render
from .train import TrainConfig, Trainer, evaluate, load_checkpoint


def training_config(args, device: str, rasterizer: str) -> TrainConfig:
    """The configuration of the training settings the CLI was given (cli.add_training_arguments)."""
    return make_config(device, rasterizer, {name: getattr(args, name) for name in TRAINING.fields
                                            if name != "progress_interval"})


def run_training(trainer: Trainer, checkpoint: Path | None, checkpoint_every: int) -> None:
    """Train to the configured step count with a progress bar; on Ctrl-C the last state is checkpointed first,
    so nothing is lost (a diverged run keeps the last periodic checkpoint, not the diverged state)."""
    total = trainer.cfg.iterations
    bar = Progress(total, "train")
    try:
        while trainer.step < total:
            trainer.train_step()
            if checkpoint and checkpoint_every and trainer.step % checkpoint_every == 0:
                trainer.save_checkpoint(checkpoint)
            bar.update(trainer.step, loss=trainer.last["loss"], psnr=trainer.last["psnr"], gaussians=len(trainer.g))
    except KeyboardInterrupt:
        if checkpoint:
            trainer.save_checkpoint(checkpoint)
            print(f"\ninterrupted at step {trainer.step}; resume with --resume", file=sys.stderr)
        raise
    except FloatingPointError as e:
        raise SplatwrightError(f"training diverged: {e}; try a lower learning rate or check the input images") from e
    finally:
        bar.close()
    if checkpoint:
        trainer.save_checkpoint(checkpoint)


def train(args) -> int:
    device, rasterizer = resolve_device(args.device)
    cfg = training_config(args, device, rasterizer)
    train_set = load_split(args.data, "train", cfg.background, args.downscale)
    test_set = load_split(args.data, "test", cfg.background, args.downscale)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.resume:
        if not (out / CHECKPOINT).is_file():
            raise SplatwrightError(f"--resume: no {CHECKPOINT} in {out}")
        trainer = Trainer.from_checkpoint(train_set, load_checkpoint(out / CHECKPOINT), device, cfg)
        print(f"resuming at step {trainer.step}", file=sys.stderr)
    else:
        trainer = Trainer(train_set, cfg, device, None if args.random_init else scene_points(args.data, cfg, device))
    run_training(trainer, out / CHECKPOINT, args.checkpoint_every)
    metrics = finish(trainer, test_set or train_set, out, device)
    print(json.dumps(metrics))
    return 0


def scene_points(folder: str | Path, cfg: TrainConfig, device: str) -> Gaussians | None:
    """Initial Gaussians on the scene's points3d.ply (a capture's surface points) if it has one, else None:
    random ones inside the cameras' view."""
    path = Path(folder) / POINTS_FILE
    if not path.is_file():
        return None
    xyz, rgb = read_points(path)
    print(f"starting from the {len(xyz)} points of {path}", file=sys.stderr)
    return Gaussians.from_point_cloud(xyz, rgb, cfg.sh_degree, device)


def finish(trainer: Trainer, eval_set: Dataset, out: Path, device: str, **extra) -> dict:
    """Write splats.ply and metrics.json (with `extra` fields) for a finished run; returns the metrics."""
    write_ply(out / "splats.ply", trainer.g)
    scores = evaluate(trainer.g, eval_set, trainer.sh_degree, trainer.cfg.background, trainer.cfg.rasterizer)
    metrics = {**scores, "iterations": trainer.step, "train_seconds": round(trainer.train_seconds, 3),
               "gaussians": len(trainer.g), "device": device_name(device), **extra}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def save_png(path: Path, image: torch.Tensor) -> None:
    array = (image.detach().clamp(0, 1).cpu().numpy() * 255 + 0.5).astype(np.uint8)
    Image.fromarray(array).save(path)


def render_views(args) -> int:
    device, rasterizer = resolve_device(args.device)
    g = read_ply(args.splats).to(device)
    cameras, names = load_cameras(args.cameras, args.downscale)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    background = parse_background(args.background)
    bar = Progress(len(cameras), "render")
    with torch.no_grad():
        for i, (cam, name) in enumerate(zip(cameras, names)):
            save_png(out / f"{name}.png", render(g, cam, g.max_sh_degree, background, rasterizer).image)
            bar.update(i + 1)
    bar.close()
    print(f"wrote {len(cameras)} images to {out}")
    return 0


def info(args) -> int:
    for key, value in system_report().items():
        print(f"{key:24s} {value}")
    return 0

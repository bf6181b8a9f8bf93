"""The CLI's commands (train, photos, render, info); each takes parsed arguments and returns an exit code."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import sequence_state
from blender_addon.core.settings import TRAINING
from ..data import load_cameras, load_split, prepare, scene_point_cloud
from ..data.dataset import Dataset
from ..data.photos import reconstruct
from ..dynamic import DYNAMIC_FILE, DynamicGaussians, read_dynamic, write_dynamic
from ..formats import formation_of, read_any, with_sh_degree
from ..formats.ply import write_ply
from ..gaussians import Gaussians
from ..policy import CHECKPOINT, device_name, make_config, resolve_device, system_report
from ..render import render
from ..service.limits import Limits
from ..train import TrainConfig, Trainer, evaluate, load_latest_checkpoint, previous_checkpoint
from .progress import Progress


def training_config(args, device: str, rasterizer: str) -> TrainConfig:
    """The configuration of the training settings the CLI was given (cli.add_training_arguments)."""
    cfg = make_config(device, rasterizer, {name: getattr(args, name) for name in TRAINING.fields
                                           if name != "progress_interval"})
    return replace(cfg, dynamic=args.dynamic)


def run_training(trainer: Trainer, checkpoint: Path | None, checkpoint_every: int,
                 checkpoint_seconds: float) -> None:
    """Train to the configured step count with a progress bar, checkpointing every `checkpoint_every` steps
    and `checkpoint_seconds` of training; on Ctrl-C the last state is checkpointed first, so nothing is lost
    (a diverged run keeps the last periodic checkpoint, not the diverged state)."""
    total = trainer.cfg.iterations
    bar = Progress(total, "train")
    try:
        while trainer.step < total:
            trainer.train_step()
            if checkpoint and trainer.checkpoint_due(checkpoint_every, checkpoint_seconds):
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
    print_note(prepare(args.data))
    train_set = load_split(args.data, "train", cfg.background, args.downscale)
    test_set = load_split(args.data, "test", cfg.background, args.downscale)
    out = output_folder(args.out)
    if args.resume:
        if not (out / CHECKPOINT).is_file() and not previous_checkpoint(out / CHECKPOINT).is_file():
            raise SplatwrightError(f"--resume: no {CHECKPOINT} in {out}")
        state, warning = load_latest_checkpoint(out / CHECKPOINT)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        trainer = Trainer.from_checkpoint(train_set, state, device, cfg)
        print(f"resuming at step {trainer.step}", file=sys.stderr)
    else:
        initial = (init_gaussians(args.init, cfg, args.spz_axes) if args.init
                   else None if args.random_init else scene_points(args.data, cfg, device))
        trainer = Trainer(train_set, cfg, device, initial)
    if trainer.note:
        print(f"warning: {trainer.note}", file=sys.stderr)
    run_training(trainer, out / CHECKPOINT, args.checkpoint_every, args.checkpoint_seconds)
    metrics = finish(trainer, test_set or train_set, out, device)
    print(json.dumps(metrics))
    return 0


def photos(args) -> int:
    """Structure from motion: the photos (or the video) args.photos to a COLMAP dataset in --out, a progress bar
    per stage."""
    limits = Limits(views=args.max_views, view_pixels=args.max_view_pixels, video_seconds=args.max_video_seconds)
    bars: dict[str, Progress] = {}
    closed: set[str] = set()

    def progress(stage: str, done: int, total: int) -> None:
        if stage in closed:
            return
        if stage not in bars:
            bars[stage] = Progress(total, stage)
        bars[stage].update(done)
        if done >= total:
            bars[stage].close()
            closed.add(stage)

    out = output_folder(args.out)
    try:
        result = reconstruct(args.photos, out, lambda *a: limits.check(*a, command="photos"), progress,
                             args.max_image_size, args.rate)
    finally:
        for stage in bars.keys() - closed:
            bars[stage].close()
    taken = "photos" if result.sampled is None else (
        f"frames ({result.sampled} taken at {args.rate:g} a second, {result.sampled - result.photos} near-duplicates "
        "dropped)")
    print(f"registered {result.registered} of {result.photos} {taken}, {result.points} points; the dataset is "
          f"{result.folder} (train on it: python -m backend train {result.folder} --out DIR)")
    return 0


def print_note(text: str | None) -> None:
    if text:
        print(f"note: {text}", file=sys.stderr)


def output_folder(path: str) -> Path:
    """The folder --out names, made if it is missing."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise SplatwrightError(f"--out {path} is a file; name a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SplatwrightError(f"--out {path}: cannot make the folder ({e.strerror or e})") from None
    return out


def scene_points(folder: str | Path, cfg: TrainConfig, device: str) -> Gaussians | None:
    """Initial Gaussians on the scene's own points (data.scene_point_cloud), if it has them, else None: random
    ones inside the cameras' view."""
    points = scene_point_cloud(folder)
    if points is None:
        return None
    path, xyz, rgb = points
    print(f"starting from the {len(xyz)} points of {path}", file=sys.stderr)
    return Gaussians.from_point_cloud(xyz, rgb, cfg.sh_degree, device)


def init_gaussians(path: str, cfg: TrainConfig, spz_axes: str = "ply") -> Gaussians:
    """The Gaussians of a splat file (any supported format; an SPZ without a coordinate-system record read in
    `spz_axes`), with SH bands fitted to the configured degree."""
    g = read_any(path, spz_axes=spz_axes)
    print(f"starting from the {len(g)} Gaussians of {path}", file=sys.stderr)
    return with_sh_degree(g, cfg.sh_degree)


def finish(trainer: Trainer, eval_set: Dataset, out: Path, device: str, **extra) -> dict:
    """Write splats.ply and metrics.json (with `extra` fields) for a finished run, and a 4D model's
    splats4d.pt (then splats.ply holds its time 0); returns the metrics."""
    if trainer.dynamic:
        write_dynamic(out / DYNAMIC_FILE, trainer.g)
    formation = trainer.cfg.image_formation
    write_ply(out / "splats.ply", trainer.g.at(0.0), formation)
    scores = evaluate(trainer.g, eval_set, trainer.sh_degree, trainer.cfg.background, trainer.cfg.rasterizer,
                      formation)
    metrics = {**scores, "iterations": trainer.step, "train_seconds": round(trainer.train_seconds, 3),
               "gaussians": len(trainer.g), "device": device_name(device), "image_formation": formation, **extra}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def save_png(path: Path, image: torch.Tensor) -> None:
    array = (image.detach().clamp(0, 1).cpu().numpy() * 255 + 0.5).astype(np.uint8)
    Image.fromarray(array).save(path)


def read_model(path: str, spz_axes: str = "ply") -> Gaussians:
    """The model of a splat file (an SPZ without a coordinate-system record read in `spz_axes`), or the 4D model of
    a splats4d.pt (any *.pt) file; a frame of a sequence that its manifest says is incomplete is read with a
    warning."""
    if Path(path).suffix == ".pt":
        return read_dynamic(path)
    g = read_any(path, spz_axes=spz_axes)
    state = sequence_state(path)
    if state is not None and not state.complete:
        print(f"warning: {state.message}", file=sys.stderr)
    return g


def model_formation(path: str) -> str:
    """The image formation a model file's model was trained for (a 4D model's file: the standard one)."""
    return "standard" if Path(path).suffix == ".pt" else formation_of(path)


def render_views(args) -> int:
    device, rasterizer = resolve_device(args.device)
    formation = model_formation(args.splats)
    g = read_model(args.splats, args.spz_axes).to(device)
    if args.time is not None and not isinstance(g, DynamicGaussians):
        raise SplatwrightError(f"--time: {args.splats} is a static model, the same at every time; give a 4D model "
                               f"({DYNAMIC_FILE} from training on views with times)")
    g = g.at(args.time or 0.0)
    print_note(prepare(args.cameras))
    cameras, names = load_cameras(args.cameras, args.downscale)
    out = output_folder(args.out)
    background = tuple(args.background)
    bar = Progress(len(cameras), "render")
    with torch.no_grad():
        for i, (cam, name) in enumerate(zip(cameras, names)):
            save_png(out / f"{name}.png", render(g, cam, g.max_sh_degree, background, rasterizer,
                                                 formation=formation).image)
            bar.update(i + 1)
    bar.close()
    print(f"wrote {len(cameras)} images to {out}")
    return 0


def info(args) -> int:
    for key, value in system_report().items():
        print(f"{key:24s} {value}")
    return 0

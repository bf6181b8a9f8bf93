"""The CLI's commands (train, photos, render, info); each takes parsed arguments and returns an exit code."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import sequence_state
from blender_addon.core.points import POINTS_FILE
from blender_addon.core.settings import FAR_FIELD_POINTS, TRAINING
from ..data import is_colmap, load_cameras, load_split, prepare, scene_point_cloud
from ..data.dataset import Dataset
from ..data.photos import reconstruct
from ..distributed import (SINGLE, Group, check_gpus, join_torchrun, launch, leave, restarted_by_torchrun,
                           under_torchrun)
from ..dynamic import DYNAMIC_FILE, DynamicGaussians, read_dynamic, write_dynamic
from ..formats import formation_of, read_any, with_sh_degree
from ..formats.ply import write_ply
from ..gaussians import Gaussians, with_far_field
from ..policy import CHECKPOINT, device_name, make_config, resolve_device, system_report
from ..render import render
from ..service.limits import Limits
from ..train import TrainConfig, Trainer, evaluate, load_latest_checkpoint, previous_checkpoint
from .progress import Progress, StageProgress


def training_config(args, device: str, rasterizer: str) -> TrainConfig:
    """The configuration of the training settings the CLI was given (cli.add_training_arguments)."""
    cfg = make_config(device, rasterizer, {name: getattr(args, name) for name in TRAINING.fields
                                           if name != "progress_interval"}, photos=is_colmap(args.data))
    return replace(cfg, dynamic=args.dynamic)


def run_training(trainer: Trainer, checkpoint: Path | None, checkpoint_every: int,
                 checkpoint_seconds: float) -> bool:
    """Train to the configured step count with a progress bar, checkpointing every `checkpoint_every` steps
    and `checkpoint_seconds` of training; Ctrl-C stops after the step under way with a checkpoint of it, so
    nothing is lost (a diverged run keeps the last periodic checkpoint, not the diverged state). In a group
    (the trainer's) these are the group's decisions: a checkpoint by the leader's clock, a stop asked of any
    process. Returns whether training reached its end (False: stopped)."""
    total = trainer.cfg.iterations
    bar = Progress(total, "train")
    try:
        with StopRequest() as stop:
            while trainer.step < total:
                trainer.train_step()
                due = bool(checkpoint) and trainer.checkpoint_due(checkpoint_every, checkpoint_seconds)
                due, stopping = trainer.group.agree([due, stop.asked])
                if stopping:
                    if checkpoint:
                        trainer.save_checkpoint(checkpoint)
                    print(f"\ninterrupted at step {trainer.step}" + ("; resume with --resume" if checkpoint else ""),
                          file=sys.stderr)
                    return False
                if due:
                    trainer.save_checkpoint(checkpoint)
                bar.update(trainer.step, loss=trainer.last["loss"], psnr=trainer.last["psnr"],
                           gaussians=trainer.share.total if trainer.share else len(trainer.g))
    except FloatingPointError as e:
        raise SplatwrightError(f"training diverged: {e}; try a lower learning rate or check the input images") from e
    finally:
        bar.close()
    if checkpoint:
        trainer.save_checkpoint(checkpoint)
    return True


class StopRequest:
    """Ctrl-C (SIGINT) while training, as a request to stop after the step under way rather than an exception in
    the middle of one: a group's processes all receive it, at different points of their step, and stop together
    at the same one. Only on the main thread, where signals are handled; elsewhere nothing asks."""

    def __enter__(self) -> "StopRequest":
        self.asked, self.before = False, None
        if threading.current_thread() is threading.main_thread():
            self.before = signal.signal(signal.SIGINT, self._ask)
        return self

    def _ask(self, *_) -> None:
        self.asked = True

    def __exit__(self, *_) -> None:
        if self.before is not None:
            signal.signal(signal.SIGINT, self.before)


def train(args) -> int:
    """The train command: in this process alone, in --gpus N processes it spawns on this host, or as one process
    of the group torchrun started (on one or more hosts)."""
    if under_torchrun():
        if args.gpus > 1:
            raise SplatwrightError("--gpus: under torchrun, torchrun starts the processes (--nproc-per-node); "
                                   "leave --gpus out")
        kind = resolve_device(args.device)[0]
        group = join_torchrun(kind)
        code = train_in_group(group, group.device, args)
        leave(group)
        return code
    if args.gpus > 1:
        kind = check_gpus(args.gpus, args.device)
        if launch(train_in_group, args.gpus, kind, args):
            print("interrupted", file=sys.stderr)
            return 130
        return 0
    return train_in_group(SINGLE, resolve_device(args.device)[0], args)


def train_in_group(group: Group, device: str | torch.device, args) -> int:
    """The train command in one process of `group` (the leader prints and writes; the others are quiet unless
    they fail). Returns the exit code."""
    with quiet_unless_leader(group):
        kind = torch.device(device).type
        cfg = training_config(args, kind, resolve_device(kind)[1])  # on a GPU without kernels: the reference
        cfg = replace(cfg, batch_views=args.views_per_step or group.world, parallel=args.parallel)
        if group.leader:  # made once, then found by the others (on another host with a copy: made there too)
            print_note(prepare(args.data))
        group.barrier()
        prepare(args.data)
        train_set = load_split(args.data, "train", cfg.background, args.downscale)
        test_set = load_split(args.data, "test", cfg.background, args.downscale)
        out = output_folder(args.out)
        checkpoint = out / CHECKPOINT
        found = checkpoint.is_file() or previous_checkpoint(checkpoint).is_file()
        if args.resume and not found:
            raise SplatwrightError(f"--resume: no {CHECKPOINT} in {out}")
        if args.resume or (restarted_by_torchrun() and found):
            state, warning = load_latest_checkpoint(checkpoint)
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
            trainer = Trainer.from_checkpoint(train_set, state, device, cfg, group)
            print(f"resuming at step {trainer.step}", file=sys.stderr)
        else:
            initial = (init_gaussians(args.init, cfg, args.spz_axes) if args.init
                       else None if args.random_init else scene_points(args.data, cfg, kind, train_set, args.far_field))
            trainer = Trainer(train_set, cfg, device, initial, group)
        if trainer.note:
            print(f"warning: {trainer.note}", file=sys.stderr)
        if group.world > 1:
            print(f"training in {group.world} processes ({trainer.cfg.parallel} parallel), "
                  f"{trainer.cfg.batch_views} views a step", file=sys.stderr)
        if not run_training(trainer, checkpoint, args.checkpoint_every, args.checkpoint_seconds):
            return 130
        model = trainer.whole_model()  # every process takes part
        if group.leader:
            extra = {"processes": group.world, "parallel": trainer.cfg.parallel} if group.world > 1 else {}
            print(json.dumps(finish(trainer, test_set or train_set, out, kind, model, **extra)))
        return 0


@contextlib.contextmanager
def quiet_unless_leader(group: Group):
    """Only the group's leader prints: the others' output goes nowhere, except the error a process fails with."""
    if group.leader:
        yield
        return
    stderr = sys.stderr
    with open(os.devnull, "w") as nothing, contextlib.redirect_stdout(nothing), contextlib.redirect_stderr(nothing):
        try:
            yield
        except BaseException as e:
            print(f"process {group.rank} of {group.world}: {e}", file=stderr)
            raise


def photos(args) -> int:
    """Structure from motion: the photos (or the video) args.photos to a COLMAP dataset in --out, a progress bar
    per stage."""
    limits = Limits(views=args.max_views, view_pixels=args.max_view_pixels, video_seconds=args.max_video_seconds)
    progress = StageProgress()
    out = output_folder(args.out)
    try:
        result = reconstruct(args.photos, out, lambda *a: limits.check(*a, command="photos"), progress,
                             args.max_image_size, args.rate)
    finally:
        progress.close()
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


def scene_points(folder: str | Path, cfg: TrainConfig, device: str, data: Dataset,
                 far: int | None = None) -> Gaussians | None:
    """Initial Gaussians on the scene's own points (data.scene_point_cloud), if it has them, else None: random
    ones inside the cameras' view. A COLMAP model's points are joined by `far` far-field points seen in the
    views of `data` (gaussians.far_field; None: FAR_FIELD_POINTS for a COLMAP model's, none for a points file's)."""
    points = scene_point_cloud(folder)
    if points is None:
        return None
    path, xyz, rgb = points
    far = far if far is not None else 0 if path.name == POINTS_FILE else FAR_FIELD_POINTS
    print(f"starting from the {len(xyz)} points of {path}" + (f" and {far} far-field points" if far else ""),
          file=sys.stderr)
    xyz, rgb = with_far_field(xyz, rgb, data.cameras, data.images, far, cfg.seed)
    return Gaussians.from_point_cloud(xyz, rgb, cfg.sh_degree, device)


def init_gaussians(path: str, cfg: TrainConfig, spz_axes: str = "ply") -> Gaussians:
    """The Gaussians of a splat file (any supported format; an SPZ without a coordinate-system record read in
    `spz_axes`), with SH bands fitted to the configured degree."""
    g = read_any(path, spz_axes=spz_axes)
    print(f"starting from the {len(g)} Gaussians of {path}", file=sys.stderr)
    return with_sh_degree(g, cfg.sh_degree)


def finish(trainer: Trainer, eval_set: Dataset, out: Path, device: str, model: Gaussians | None = None,
           **extra) -> dict:
    """Write splats.ply and metrics.json (with `extra` fields) for a finished run of the trainer's model (or
    `model`, a partitioned group's whole one), and a 4D model's splats4d.pt (then splats.ply holds its time 0);
    returns the metrics."""
    model = trainer.g if model is None else model
    if trainer.dynamic:
        write_dynamic(out / DYNAMIC_FILE, model)
    formation = trainer.cfg.image_formation
    write_ply(out / "splats.ply", model.at(0.0), formation)
    scores = evaluate(model, eval_set, trainer.sh_degree, trainer.cfg.background, trainer.cfg.rasterizer,
                      formation)
    metrics = {**scores, "iterations": trainer.step, "train_seconds": round(trainer.train_seconds, 3),
               "gaussians": len(model), "device": device_name(device), "image_formation": formation,
               "appearance": trainer.cfg.colour_transforms, **extra}
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

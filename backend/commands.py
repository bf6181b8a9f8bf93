"""The CLI's commands; each takes parsed arguments and returns an exit code."""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .data import Dataset, load_cameras, load_rgb, load_split, parse_background
from .errors import SplatwrightError
from .gaussians import Gaussians
from .metrics import psnr
from .ply import read_ply, write_ply
from .points import POINTS_FILE, read_points
from .progress import Progress
from .render import render
from .strategy import DensifyConfig
from .train import TrainConfig, Trainer, evaluate, load_checkpoint

CHECKPOINT = "checkpoint.pt"
LEGO = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "lego"


def resolve_device(name: str) -> tuple[str, str]:
    """(torch device, rasterizer) for --device auto|cpu|cuda."""
    if name == "cuda" and not torch.cuda.is_available():
        raise SplatwrightError("--device cuda: no CUDA GPU is visible to torch; use --device cpu")
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return "cuda", "cuda"
    return "cpu", "reference"


PRESETS = {
    "quality": TrainConfig(iterations=30_000),
    # The shortest schedule measured to reach 31 dB on lego: one opacity reset at 2000, densification until 3500.
    "fast": TrainConfig(iterations=5000, densify=DensifyConfig(stop=3500, reset_opacity_every=2000)),
}


def cpu_config(iterations: int) -> TrainConfig:
    """A short schedule for the CPU reference path at small image sizes."""
    return TrainConfig(
        iterations=iterations, init_points=5000, sh_interval=max(1, iterations // 4),
        densify=DensifyConfig(start=100, every=100, stop=int(iterations * 0.8), reset_opacity_every=0,
                              max_gaussians=20_000))


CPU_ITERATIONS = 3000  # default step count on the CPU reference path


def make_config(device: str, rasterizer: str, *, preset: str = "quality", iterations: int | None = None,
                sh_degree: int = 3, max_gaussians: int | None = None, background=(1.0, 1.0, 1.0),
                init_points: int | None = None, seed: int = 0) -> TrainConfig:
    """The training configuration for a device: a preset's schedule on the GPU, the short CPU schedule on the
    reference path, with the user's choices on top (None keeps the schedule's own value)."""
    if device == "cuda":
        cfg = PRESETS[preset]
        cfg = replace(cfg, iterations=iterations or cfg.iterations)
    else:
        cfg = cpu_config(iterations or CPU_ITERATIONS)
    densify = cfg.densify
    if max_gaussians is not None:
        densify = replace(densify, max_gaussians=max_gaussians)
    return replace(cfg, rasterizer=rasterizer, sh_degree=sh_degree, seed=seed, background=tuple(background),
                   densify=densify, init_points=init_points or cfg.init_points)


def training_config(args, device: str, rasterizer: str) -> TrainConfig:
    return make_config(device, rasterizer, preset=args.preset, iterations=args.iters, sh_degree=args.sh_degree,
                       max_gaussians=args.max_gaussians, background=parse_background(args.background),
                       init_points=args.init_points, seed=args.seed)


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


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"cpu ({platform.processor() or platform.machine()})"


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


def system_report() -> dict:
    """Python, torch, CUDA, the GPU and whether the CUDA rasterizer builds."""
    report = {"python": platform.python_version(), "torch": torch.__version__,
              "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
              "gpu": None, "gpu_memory_gb": None, "cuda_rasterizer": False,
              "cuda_rasterizer_detail": "no CUDA GPU; the CPU reference rasterizer is used"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        report["gpu"], report["gpu_memory_gb"] = props.name, round(props.total_memory / 2**30, 1)
        from .kernels import is_available
        report["cuda_rasterizer"], report["cuda_rasterizer_detail"] = is_available()
    return report


def info(args) -> int:
    for key, value in system_report().items():
        print(f"{key:24s} {value}")
    return 0


def demo(args) -> int:
    """`./run demo`: the Blender add-on end to end when the bpy module (Blender 4.5) is importable, otherwise
    training on the lego scene; with a scene folder, training on that scene."""
    out = Path(args.out or f"out/demo-{datetime.now():%Y%m%d-%H%M%S}")
    if args.data is None and importlib.util.find_spec("bpy") is not None:
        return blender_demo(args, out)
    if args.data is None:
        print("demo: the bpy module (Blender 4.5, pip install bpy==4.5.*) is not importable, so the Blender demo "
              "cannot run; training on the lego scene instead", file=sys.stderr)
    return scene_demo(args, Path(args.data or LEGO), out)


def blender_demo(args, out: Path) -> int:
    """backend/demo_blender.py in its own process (bpy there, torch here), then the report: the engine's renders
    of the held-out views against Cycles' renders from the same cameras."""
    out.mkdir(parents=True, exist_ok=True)
    user = out / "blender-user"  # the add-on installs here, not into the user's own Blender
    env = {**os.environ, "BLENDER_USER_SCRIPTS": str(user / "scripts"), "BLENDER_USER_CONFIG": str(user / "config"),
           "BLENDER_USER_EXTENSIONS": str(user / "extensions"),
           **({"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {})}
    print(f"demo: Blender {'(CPU only) ' if args.device == 'cpu' else ''}scene -> add-on capture -> training -> "
          f"novel views, output in {out}", file=sys.stderr)
    # Blender's render progress lines go to stdout, the demo's own progress and any traceback to stderr.
    run = subprocess.run([sys.executable, "-m", "backend.demo_blender", "--out", str(out)], env=env,
                         cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.DEVNULL)
    if run.returncode != 0:
        raise SplatwrightError(f"the Blender part of the demo failed (exit code {run.returncode}); see above")
    info = json.loads((out / "blender.json").read_text())
    truth = load_split(info["dataset"], "test")  # Cycles' RGBA renders over white, as training saw them
    views = []
    for name, gt in zip(info["held_out"], truth.images):
        novel = torch.from_numpy(load_rgb(out / "novel" / f"{name}.png", (1.0, 1.0, 1.0)))
        views.append({"name": name, "psnr": round(psnr(novel, gt), 2)})
    mean = round(float(np.mean([v["psnr"] for v in views])), 2)
    metrics = {**info, "novel_views": views, "mean_psnr": mean}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    dataset = Path(info["dataset"])
    rows = "\n".join(f"| {v['name']} | {v['psnr']:.2f} | ![]({os.path.relpath(out / 'novel' / (v['name'] + '.png'), out)}) | "
                     f"![]({os.path.relpath(dataset / 'test' / (v['name'] + '.png'), out)}) |" for v in views)
    (out / "report.md").write_text(f"""# Splatwright demo

A Blender {info['blender']} scene of coloured meshes, captured by the add-on with Cycles ({info['views']} orbit views at
{info['size']}x{info['size']}, every 8th held out), trained on the backend ({info['gpu'] or 'CPU reference rasterizer'},
{info['steps']} steps, {info['train_seconds']} s, {info['gaussians']} Gaussians), then the held-out cameras rendered
through the add-on's render engine ({info['render_seconds']} s for {len(views)} views) and compared with Cycles' renders
from the same cameras.

Mean PSNR over the held-out views: **{mean:.2f} dB** (training PSNR at the end: {info['train_psnr'] or 0:.2f} dB).

| view | PSNR (dB) | Splatwright (novel view) | Cycles |
|---|---|---|---|
{rows}

Files: `splats.ply` (3DGS PLY), `novel/` (engine renders), `{os.path.relpath(dataset, out)}/` (the capture),
`metrics.json`.
""")
    scores = ", ".join(f"{v['psnr']:.1f}" for v in views)
    print(f"demo: held-out views {scores} dB, mean {mean:.2f} dB; "
          f"wrote {out}/report.md, {out}/metrics.json, {out}/splats.ply, {out}/novel/", file=sys.stderr)
    return 0


def scene_demo(args, data: Path, out: Path) -> int:
    """Train on a scene end to end: the GPU at full size, or the CPU reference path at about 100 px."""
    device, rasterizer = resolve_device(args.device)
    out.mkdir(parents=True, exist_ok=True)
    cfg = make_config(device, rasterizer, preset="fast", iterations=None if device == "cuda" else 600)
    downscale = 1.0 if device == "cuda" else None
    print(f"demo: {data} on {device_name(device)}, output in {out}", file=sys.stderr)
    if downscale is None:  # CPU: about 100 px wide
        probe, _ = load_cameras(data / "transforms_train.json")
        downscale = max(1.0, probe[0].width / 100)
    train_set = load_split(data, "train", cfg.background, downscale)
    test_set = load_split(data, "test", cfg.background, downscale) or train_set
    trainer = Trainer(train_set, cfg, device, scene_points(data, cfg, device))
    initial = evaluate(trainer.g, test_set, 0, cfg.background, rasterizer)
    run_training(trainer, out / CHECKPOINT, 0)
    metrics = finish(trainer, test_set, out, device, initial_psnr=initial["psnr"])

    views = out / "views"
    views.mkdir(exist_ok=True)
    with torch.no_grad():
        for i in np.linspace(0, len(test_set) - 1, 4).astype(int):
            cam = test_set.cameras[i]
            save_png(views / f"{i:03d}_render.png",
                     render(trainer.g, cam, trainer.sh_degree, cfg.background, rasterizer).image)
            save_png(views / f"{i:03d}_truth.png", test_set.images[i])
    print(f"test PSNR {initial['psnr']:.2f} dB -> {metrics['psnr']:.2f} dB, SSIM {metrics['ssim']:.3f}, "
          f"{metrics['gaussians']} Gaussians, {metrics['train_seconds']:.0f} s training; "
          f"wrote {out}/splats.ply, {views}/, {out}/metrics.json")
    return 0


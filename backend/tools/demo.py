"""`./run demo`: the Blender add-on end to end when the bpy module (Blender 4.5) is importable, otherwise
training on a scene folder (lego by default)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.settings import training_settings
from ..data import LEGO, load_cameras, load_split
from ..data.images import load_rgb
from ..metrics import psnr
from ..policy import CHECKPOINT, device_name, make_config, resolve_device
from ..render import render
from ..train import Trainer, evaluate
from .commands import finish, run_training, save_png, scene_points


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
    """backend/tools/demo_blender.py in its own process (bpy there, torch here), then the report: the engine's renders
    of the held-out views against Cycles' renders from the same cameras."""
    out.mkdir(parents=True, exist_ok=True)
    user = out / "blender-user"  # the add-on installs here, not into the user's own Blender
    env = {**os.environ, "BLENDER_USER_SCRIPTS": str(user / "scripts"), "BLENDER_USER_CONFIG": str(user / "config"),
           "BLENDER_USER_EXTENSIONS": str(user / "extensions"),
           **({"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {})}
    print(f"demo: Blender {'(CPU only) ' if args.device == 'cpu' else ''}scene -> add-on capture -> training -> "
          f"novel views, output in {out}", file=sys.stderr)
    # Blender's render progress lines go to stdout, the demo's own progress and any traceback to stderr.
    run = subprocess.run([sys.executable, "-m", "backend.tools.demo_blender", "--out", str(out)], env=env,
                         cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL)
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
    settings = training_settings(preset="fast", iterations=None if device == "cuda" else 600)
    cfg = make_config(device, rasterizer, settings)
    downscale = 1.0 if device == "cuda" else None
    print(f"demo: {data} on {device_name(device)}, output in {out}", file=sys.stderr)
    if downscale is None:  # CPU: about 100 px wide
        probe, _ = load_cameras(data / "transforms_train.json")
        downscale = max(1.0, probe[0].width / 100)
    train_set = load_split(data, "train", cfg.background, downscale)
    test_set = load_split(data, "test", cfg.background, downscale) or train_set
    trainer = Trainer(train_set, cfg, device, scene_points(data, cfg, device, train_set, settings["far_field"]))
    initial = evaluate(trainer.g, test_set, 0, cfg.background, rasterizer)
    run_training(trainer, out / CHECKPOINT, 0, 0.0)  # one checkpoint, at the end
    metrics = finish(trainer, test_set, out, device, initial_psnr=initial["psnr"])

    views = out / "views"
    views.mkdir(exist_ok=True)
    with torch.no_grad():
        for i in np.linspace(0, len(test_set) - 1, 4).astype(int):
            cam = test_set.cameras[i]
            save_png(views / f"{i:03d}_render.png",
                     render(trainer.g, cam, trainer.sh_degree, cfg.background, rasterizer).image)
            save_png(views / f"{i:03d}_truth.png", test_set.image(i))
    print(f"test PSNR {initial['psnr']:.2f} dB -> {metrics['psnr']:.2f} dB, SSIM {metrics['ssim']:.3f}, "
          f"{metrics['gaussians']} Gaussians, {metrics['train_seconds']:.0f} s training; "
          f"wrote {out}/splats.ply, {views}/, {out}/metrics.json")
    return 0


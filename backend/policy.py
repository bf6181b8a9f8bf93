"""Training policy: which device and rasterizer to use, the schedules (presets) and the training
configuration a set of settings (blender_addon/core/settings.py) makes on a device. Read by the CLI, the
server and the benchmarks."""
from __future__ import annotations

import platform
from dataclasses import replace

import torch

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.settings import CPU_STEPS, PRESETS as PRESET_NAMES, SCHEDULE_STEPS
from .kernels import is_available
from .strategy import DensifyConfig
from .train import LearningRates, TrainConfig, with_steps

CHECKPOINT = "checkpoint.pt"  # a training run's checkpoint file, in its output or session folder


def resolve_device(name: str, build: bool = True) -> tuple[str, str]:
    """(torch device, rasterizer) for --device auto|cpu|cuda: on a GPU the CUDA kernels, or where they cannot be
    had (kernels.py) the reference rasterizer on the GPU; the trainer's note then says why it is slow. With
    build=False (a server that must answer soon) kernels that need building count as there (kernels.is_available)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise SplatwrightError("--device cuda: no CUDA GPU is visible to torch; use --device cpu")
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return "cuda", "cuda" if is_available(build)[0] else "reference"
    return "cpu", "reference"


# Measured on an H200 (bench/results/train-*-schedules-*, train-presets-per-view-20261203.md): the original 3DGS
# schedule's 30k steps reach 1.1 dB more on lego and 1.0 dB more on the interior than 12k steps densifying to two
# thirds of them, in 2.6x the time; 12k beats gsplat's simple_trainer at 30k on both (and a longer run is one Steps
# setting away). Quality densifies to 8000 with opacity resets every 2500: a third reset late in densification
# helps cameras inside a room (from random start colours, the interior over seeds 0-2: mean 35.11 -> 35.63 dB,
# fewer Gaussians, the same time; lego -0.3 dB). Fast: 6500 steps densifying to 4500 with resets every 1500, positions
# starting at 2x the standard rate, which buys back most of what the shorter schedule loses (at 2.5x lego gained
# 0.04 dB and the interior lost 0.6; 1x, more resets or densifying longer did no better there:
# train-seeds-20261204.md; shorter schedules without opacity resets collapse on lego: train-step-20261202.md).
# Both start from 50k random Gaussians (train.random_start), not 3DGS's 100k: fewer floaters to prune, and the
# early steps cost less (train-init-points-20261203.md). Fast ends 0.4-1.2 dB below quality on the bench's scenes
# (train-init-colour-20261204.md).
# Fast's rate decays to the standard final one, so it starts at 2x and falls faster.
# Each schedule stretches to a number of steps a training view (train.fit_to_views): the 1920x1080 room's 160
# views hold more than a count tuned on lego fits (quality at 12000 steps 0.5 dB below gsplat's simple_trainer
# at 30k, at 17600 0.5 dB above it in 0.23x its time; fast, with positions at 2.5x, at 6500 steps 2.9 dB below
# the stretched quality, at 10400 1.0; both measured from random start colours). Lego's 100 views and the
# interior's 80 keep the fixed counts; views over time (a 4D capture: cameras at times) are not stretched.


def schedule(preset: str, **settings) -> TrainConfig:
    """A preset's configuration: its steps (core/settings.py's SCHEDULE_STEPS) and `settings`."""
    steps, steps_per_view = SCHEDULE_STEPS[preset]
    return TrainConfig(iterations=steps, min_steps_per_view=steps_per_view, **settings)


PRESETS = {
    "quality": schedule("quality", init_points=50_000, densify=DensifyConfig(stop=8000, reset_opacity_every=2500)),
    "fast": schedule("fast", init_points=50_000, lr=LearningRates(means=3.2e-4),
                     densify=DensifyConfig(stop=4500, reset_opacity_every=1500)),
    # Captures over time: every view is one time of one camera, so a 4D model sees each camera-time once per
    # epoch; the longer schedule lets motion and windows settle after densification.
    "dynamic": schedule("dynamic", densify=DensifyConfig(stop=7500, reset_opacity_every=3000)),
}
assert tuple(PRESETS) == PRESET_NAMES


def cpu_config(iterations: int) -> TrainConfig:
    """A short schedule for the CPU reference path at small image sizes."""
    return TrainConfig(
        iterations=iterations, init_points=5000, sh_interval=max(1, iterations // 4),
        # Colours at 4x the standard rates: at the standard ones, a few hundred steps cannot move a colour
        # across its range (Blender's startup cube at 300 steps: held-out 13.6 dB, at 4x 25.9 dB); so the photos'
        # colour transforms too, each seen a few times.
        lr=LearningRates(sh_dc=4 * LearningRates.sh_dc, sh_rest=4 * LearningRates.sh_rest,
                         colour_transforms=4 * LearningRates.colour_transforms),
        densify=DensifyConfig(start=100, every=100, stop=int(iterations * 0.8), reset_opacity_every=0,
                              max_gaussians=20_000))


def make_config(device: str, rasterizer: str, s: dict, photos: bool = False) -> TrainConfig:
    """The training configuration for a device: a preset's schedule on the GPU, the short CPU schedule on the
    reference path, with the settings `s` on top (every setting of the table, checked where they came in:
    the protocol's request, the command line's options, training_settings; None keeps the schedule's own
    value). `photos`: the views are photos (data.is_colmap), for which appearance "auto" is on."""
    if device == "cuda":
        cfg = PRESETS[s["preset"]]
        if s["iterations"]:
            cfg = with_steps(cfg, s["iterations"])
    else:
        cfg = cpu_config(s["iterations"] or CPU_STEPS)
    densify = cfg.densify
    if s["max_gaussians"] is not None:
        densify = replace(densify, max_gaussians=s["max_gaussians"])
    return replace(cfg, rasterizer=rasterizer, sh_degree=s["sh_degree"], seed=s["seed"],
                   background=tuple(s["background"]), densify=densify,
                   init_points=s["init_points"] or cfg.init_points, image_formation=s["image_formation"],
                   colour_transforms=s["appearance"] == "on" or (s["appearance"] == "auto" and photos))


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"cpu ({platform.processor() or platform.machine()})"


def system_report() -> dict:
    """Python, torch, CUDA, the GPU and whether the CUDA rasterizer builds."""
    report = {"python": platform.python_version(), "torch": torch.__version__,
              "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
              "gpu": None, "gpu_memory_gb": None, "cuda_rasterizer": False,
              "cuda_rasterizer_detail": "no CUDA GPU; the CPU reference rasterizer is used"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        report["gpu"], report["gpu_memory_gb"] = props.name, round(props.total_memory / 2**30, 1)
        report["cuda_rasterizer"], report["cuda_rasterizer_detail"] = is_available()
    return report

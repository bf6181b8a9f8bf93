"""The capture and training settings a scene starts with, per backend device, and the panel's estimate of how
long training takes (bpy-free). A GPU backend gets full-size captures and the backend's quality schedule; the
CPU backend gets a preview that captures and trains Blender's startup scene within a few minutes on two cores.
"""
from __future__ import annotations

import functools
import os
import platform
import shutil
from pathlib import Path

from ..core.settings import CPU_STEPS, SCHEDULE_STEPS, default, stretched_steps

GPU, CPU = "cuda", "cpu"  # the backend's devices, as its capabilities name them
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # there where Linux has NVIDIA's driver loaded

# The panel's settings (Scene.splatwright) per device; the GPU's are the properties' own defaults.
DEVICE_DEFAULTS = {
    GPU: {"orbit_count": 32, "resolution_percentage": 100, "max_side": 0, "point_count": 20_000,
          "render_engine": "SCENE", "samples": 0, "custom_steps": False,
          "iterations": default("iterations", f"panel-{GPU}")},
    CPU: {"orbit_count": 16, "resolution_percentage": 100, "max_side": 160, "point_count": 2000,
          "render_engine": "CYCLES", "samples": 16, "custom_steps": True,
          "iterations": default("iterations", f"panel-{CPU}")},
}

# Seconds per training step: a fixed part plus a part per pixel of the step's view (rough: the splats' sizes
# matter too). CPU: the reference rasterizer (backend/policy.py's cpu_config) on 2 idle cores, 300 steps of
# the CPU previews: Blender's startup cube at 153x86 px in 33 s, the demo scene at 151x151 px in 45 s
# (`python -m backend bench defaults`; other work on the same cores makes it several times slower).
# GPU: the CUDA rasterizer on an H200 (quality preset: lego's 400x400 views 10.5 s for 12000 steps, the interior's
# 640x360 9.4 s for 12000, a 1920x1080 room 47 s for 17600; bench/results/train-presets-per-view-20261203.md).
STEP_SECONDS = {CPU: (0.05, 4.5e-6), GPU: (0.0007, 1.0e-9)}


def device_of(device: str | None) -> str:
    """The defaults' device for a backend's reported device (anything but a CUDA GPU trains on the CPU)."""
    return GPU if device == GPU else CPU


@functools.cache
def machine_device() -> str:
    """The device a backend started on this machine most likely trains on, for the settings before one says:
    a CUDA GPU where an NVIDIA driver is installed, else the CPU."""
    system = platform.system()
    if system == "Linux":
        return GPU if NVIDIA_DRIVER.is_file() else CPU
    if system == "Windows":
        system32 = Path(os.environ.get("SystemRoot", r"C:\Windows")) / "System32"
        return GPU if shutil.which("nvidia-smi") or (system32 / "nvidia-smi.exe").is_file() else CPU
    return CPU  # macOS: no CUDA


def defaults_for(device: str | None) -> dict:
    """The settings a scene starts with on this device."""
    return dict(DEVICE_DEFAULTS[device_of(device)])


def schedule_steps(device: str | None, preset: str, steps: int | None, views: int) -> int:
    """The steps a training run on `views` training views (0 for a capture over time) makes: the chosen count,
    else the schedule's on this device."""
    if steps:
        return steps
    if device_of(device) != GPU:
        return CPU_STEPS
    return stretched_steps(*SCHEDULE_STEPS[preset], views)


def training_seconds(device: str | None, steps: int, width: int, height: int) -> float:
    """About how long `steps` training steps on views of width x height take on this device."""
    fixed, per_pixel = STEP_SECONDS[device_of(device)]
    return steps * (fixed + per_pixel * width * height)

"""`python -m backend bench profile`: where a GPU training step's time goes, from the torch profiler.

Device time is grouped by kernel name into stages; what the GPU does not account for is host-side
overhead (Python, launches, synchronisation)."""
from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from ...data import LEGO, load_split
from ...policy import PRESETS
from ...render.cuda import project_and_bin
from ...train import Trainer

# First match wins; kernel names come from cuda/ and from torch's own kernels.
STAGES = [
    ("projection (with the tile counts)", r"projection_(fwd|bwd)|footprint_kernel|sh_colors|ray_projection"),
    ("motion (4D)", r"motion_(fwd|bwd)"),
    ("binning + sort",
     r"emit_keys|emit_ray_keys|rect_tile_counts|gather_ids|tile_ranges|tile_batch|batch_tiles|RadixSort|DeviceScan|"
     r"cub::"),
    ("rasterize forward", r"rasterize_fwd"),
    ("rasterize backward", r"rasterize_bwd|sum_entry_grads"),
    ("film (Blender's formation)", r"film_(fwd|bwd)"),
    ("optimizer (Adam)", r"adam"),
    ("loss (fused L1 + D-SSIM)", r"ssim_|loss_"),
    ("densification + indexing", r"grad_stats|index|gather|scatter|nonzero|masked|sort|topk"),
]
OTHER = "other GPU (elementwise, activations, copies)"


def stage_of(kernel: str) -> str:
    return next((name for name, pattern in STAGES if re.search(pattern, kernel)), OTHER)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench profile")
    p.add_argument("--data", default=str(LEGO))
    p.add_argument("--preset", default="quality", choices=sorted(PRESETS))
    p.add_argument("--warmup", type=int, default=2000, help="steps before profiling (lets the model grow)")
    p.add_argument("--steps", type=int, default=200, help="profiled steps")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench profile needs a CUDA GPU", file=sys.stderr)
        return 1
    cfg = replace(PRESETS[args.preset], rasterizer="cuda")
    trainer = Trainer(load_split(args.data, "train", cfg.background), cfg, "cuda")
    while trainer.step < args.warmup:
        trainer.train_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            trainer.train_step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / args.steps

    per_stage = {name: 0.0 for name, _ in STAGES} | {OTHER: 0.0}
    averages = prof.key_averages()
    for event in averages:
        device_us = getattr(event, "self_device_time_total", 0) or 0
        if device_us <= 0 or event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        per_stage[stage_of(event.key)] += device_us / 1e3 / args.steps
    gpu_ms = sum(per_stage.values())
    print(f"step {trainer.step}, {len(trainer.g)} Gaussians, {torch.cuda.get_device_name()}: "
          f"{wall_ms:.2f} ms/step wall, {gpu_ms:.2f} ms/step GPU busy")
    print("| stage | ms/step | share of wall |")
    print("|---|---|---|")
    for name, ms in sorted(per_stage.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {ms:.3f} | {100 * ms / wall_ms:.1f}% |")
    overhead = max(0.0, wall_ms - gpu_ms)
    print(f"| host overhead (Python, launches, syncs) | {overhead:.3f} | {100 * overhead / wall_ms:.1f}% |")
    host_table(averages, args.steps)
    tile_balance(trainer)
    return 0


def tile_balance(trainer: Trainer) -> None:
    """Tile entries per 16x16 tile over the training views. Every tile of a small image runs at once, so the
    most loaded tiles, not the total, set the rasterizer's time."""
    g = trainer.g
    per_view = []
    with torch.no_grad():
        for cam, (viewmat, K) in zip(trainer.data.cameras, trainer.views):
            ranges = project_and_bin(g.means, g.quats, torch.exp(g.log_scales), g.opacities.contiguous(),
                                     g.sh.contiguous(), viewmat, K, cam.width, cam.height, trainer.sh_degree).ranges
            per_view.append((ranges[:, 1] - ranges[:, 0]).float())
    # Views may differ in size, so in tile count: each view's figures, then their means.
    entries = sum(float(counts.sum()) for counts in per_view)
    tiles = sum(len(counts) for counts in per_view)
    busiest = [float(counts.max()) for counts in per_view]
    ratio = sum(top / float(counts.mean()) for top, counts in zip(busiest, per_view)) / len(per_view)
    print(f"\ntile entries per view: {entries / len(per_view):,.0f} over {tiles / len(per_view):,.0f} tiles; per tile "
          f"mean {entries / tiles:.0f}, busiest tile {sum(busiest) / len(busiest):.0f} (max/mean {ratio:.1f})")


def host_table(averages, steps: int, rows: int = 15) -> None:
    """The host side: kernel launches per step, time blocked waiting for the GPU, and the operators with the
    most CPU time of their own (Python and dispatch included)."""
    events = [e for e in averages if e.device_type == torch.autograd.DeviceType.CPU]
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC"))
    waiting = sum(e.self_cpu_time_total for e in events if re.search(r"Synchronize|cudaMemcpy", e.key))
    print(f"\nhost: {launches / steps:.0f} kernel launches per step; {waiting / 1e3 / steps:.3f} ms/step blocked "
          f"waiting for the GPU (synchronise, copies to the host)")
    print("| host operator | calls/step | self CPU ms/step |")
    print("|---|---|---|")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:rows]:
        print(f"| {e.key} | {e.count / steps:.1f} | {e.self_cpu_time_total / 1e3 / steps:.3f} |")

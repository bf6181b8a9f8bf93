"""What a frame change costs Blender's main thread for a 4D model shown as Blender's own splats (5.3 and later):
`scene.frame_set` of a native splat object holding a random 4D model (SH degree 3), timed in a bpy 5.3 process
(blender_native4d.py) over 20 frames, median, p95 and max, against a 50 ms budget. Beside it, the parts: the
opacity handler's share of frame_set (timed where Blender calls it), the motion modifier's Geometry Nodes
evaluation alone (opacity handler off), and the other design, a frame handler that writes positions, rotations
and opacities evaluated in numpy (logic/native.motion_at).

    python -m backend bench native4d [--gaussians 500000] [--frames 20] [--python BPY53_PYTHON] [--out DIR]

--python names a Python whose `bpy` is 5.3 or later (default $SPLATWRIGHT_BPY53, else .venv-bpy53's). Writes
native4d-<date>.json and .md into --out (default bench/results).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from blender_addon.core.splats import SplatArrays
from blender_addon.logic.native import motion_attributes
from ...dynamic import DynamicGaussians
from . import RESULTS, ROOT, git_commit, write_results

SCENARIO = Path(__file__).resolve().parent / "blender_native4d.py"
BUDGET_MS = 50.0


def random_model(n: int, seed: int = 0) -> DynamicGaussians:
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    return DynamicGaussians(means=r(n, 3), log_scales=0.3 * r(n, 3) - 4.0, quats=r(n, 4), opacity_logits=r(n),
                            sh_dc=r(n, 3), sh_rest=0.1 * r(n, 15, 3), velocities=0.3 * r(n, 3),
                            accelerations=0.3 * r(n, 3), angular_velocities=r(n, 3),
                            time_centers=torch.rand(n, generator=gen), time_precisions=8.0 * torch.rand(n, generator=gen))


def attributes(g: DynamicGaussians) -> dict[str, np.ndarray]:
    t = {k: v.detach().float().numpy() for k, v in g.tensors().items()}
    model = SplatArrays(t["means"], t["log_scales"], t["quats"], t["opacity_logits"], t["sh_dc"], t["sh_rest"])
    return motion_attributes(model, t)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench native4d", description=__doc__.split("\n")[0])
    p.add_argument("--gaussians", type=int, default=500_000)
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--python", default=os.environ.get("SPLATWRIGHT_BPY53", str(ROOT / ".venv-bpy53" / "bin" / "python")))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="splatwright-native4d-") as work:
        path = Path(work) / "model.npz"
        np.savez(path, **{k.replace(":", "__"): v for k, v in attributes(random_model(args.gaussians)).items()})
        run = subprocess.run([args.python, str(SCENARIO), str(path), str(args.frames)], capture_output=True,
                             text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if run.returncode or not lines:
        raise SystemExit(f"{args.python} {SCENARIO.name} failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    info = json.loads(lines[-1][len("RESULT "):])
    now = datetime.datetime.now(datetime.timezone.utc)
    result = {"benchmark": "native4d", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
              "gaussians": args.gaussians, "frames": args.frames, "budget_ms": BUDGET_MS, "cpus": os.cpu_count(),
              **info}
    rows = [f"| {what} | {t['median_ms']:.1f} | {t['p95_ms']:.1f} | {t['max_ms']:.1f} |"
            for what, t in info["timings"].items()]
    frame_set = info["timings"]["frame_set"]
    verdict = "within" if frame_set["p95_ms"] <= BUDGET_MS else "over"
    report = "\n".join([
        f"A frame change of a native 4D splat object: {args.gaussians} Gaussians (SH degree 3), Blender "
        f"{info['blender']} (bpy module, CPU, {os.cpu_count()} cores), {args.frames} frames; commit "
        f"{result['commit']}, {result['date']}", "",
        "| what | median ms | p95 ms | max ms |", "|---|---|---|---|", *rows, "",
        f"frame_set (the motion modifier's Geometry Nodes and the opacity handler, as the add-on sets them up) is "
        f"{verdict} the {BUDGET_MS:.0f} ms budget at p95. The numpy handler is the other design: positions, "
        "rotations and opacities evaluated in numpy and written into the point cloud at each frame change."])
    write_results(args.out, f"native4d-{now.strftime('%Y%m%d-%H%M')}", result, report)
    return 0

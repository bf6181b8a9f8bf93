"""Rasterizer benchmark: forward and forward+backward median milliseconds of the CUDA rasterizer on random
scenes, and on a stored model (--ply: a trained one, from outside and from within, where splats close to the
camera each cover many tiles as they do in a room captured from inside), and of gsplat.rasterization on the same
inputs in the same process where gsplat is importable.

Timing: CUDA events around each call after warm-up, median over repetitions. Forward runs with inputs that
require grad (as in training); forward+backward adds the backward of image against a fixed random gradient,
means2d's gradient retained on both sides. Results go to bench/results/raster-<date>-<gpu>.{json,md}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
from pathlib import Path

import numpy as np
import torch

from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from blender_addon.core.errors import SplatwrightError
from blender_addon.logic.dataset import fitting_distance
from ...formats import read_any
from ...kernels import extension
from ...render import cuda
from ...render.constants import DILATION, NEAR_PLANE, TILE
from . import RESULTS, git_commit, model_extent

# name, Gaussians, width, height, mean footprint sigma in pixels (denser scenes get smaller splats)
SIZES = {
    "100k@800x800": (100_000, 800, 800, 2.5),
    "1M@1920x1080": (1_000_000, 1920, 1080, 1.5),
    "3M@1920x1080": (3_000_000, 1920, 1080, 1.0),
    # small models, such as a downloaded object splat viewed at full HD: few, large splats
    "10k@1920x1080": (10_000, 1920, 1080, 8.0),
    "50k@1920x1080": (50_000, 1920, 1080, 4.0),
}
SH_DEGREE = 3


def make_scene(n: int, width: int, height: int, sigma_px: float, seed: int, device) -> dict:
    """Gaussians in front of a pinhole camera, spread a little past the view, with screen-space sizes around
    sigma_px, anisotropic, random rotations, sigmoid-of-normal opacities and degree-3 SH."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    fx = 1.1 * max(width, height)
    K = torch.tensor([[fx, 0, width / 2], [0, fx, height / 2], [0, 0, 1]])
    z = 2 + 10 * torch.rand(n, generator=gen)
    u = (torch.rand(n, generator=gen) * 1.2 - 0.1) * width
    v = (torch.rand(n, generator=gen) * 1.2 - 0.1) * height
    cam = torch.stack([(u - width / 2) / fx * z, (v - height / 2) / fx * z, z], dim=-1)
    viewmat = torch.eye(4)
    viewmat[:3, 3] = torch.tensor([0.3, -0.2, 1.0])  # world = camera - t
    scales = (sigma_px * z / fx)[:, None] * torch.exp(0.4 * torch.randn(n, 3, generator=gen))
    sh = 0.1 * torch.randn(n, 16, 3, generator=gen)
    sh[:, 0] = 0.8 * torch.randn(n, 3, generator=gen)
    scene = {
        "means": cam - viewmat[:3, 3],
        "quats": torch.randn(n, 4, generator=gen),
        "scales": scales,
        "opacities": torch.sigmoid(torch.randn(n, generator=gen)),
        "sh": sh,
        "viewmat": viewmat,
        "K": K,
        "background": torch.rand(3, generator=gen),
        "sh_degree": SH_DEGREE,
    }
    return on_device(scene, device)


def model_scenes(path: Path, width: int, height: int) -> dict[str, dict]:
    """A stored model at width x height through two cameras looking at its centre (its means' median): from
    outside, where the model fills the view, and from the centre itself, along +x. Named "<file stem> outside" and
    "<file stem> inside"; drawn at the model's own SH degree; on the CPU (on_device puts one on the GPU)."""
    g = read_any(path).detached()
    centre, radius = model_extent(g.means, 0.9)
    K = intrinsics_from_fov_x(1.2, width, height)
    distance = fitting_distance(radius, K, width, height)
    eyes = {"outside": (centre + distance * np.array([0.8, -0.6, 0.0]), centre),
            "inside": (centre, centre + np.array([radius, 0.0, 0.0]))}
    model = {"means": g.means, "quats": g.quats, "scales": torch.exp(g.log_scales), "opacities": g.opacities,
             "sh": g.sh, "background": torch.ones(3), "sh_degree": g.max_sh_degree}
    scenes = {}
    for where, (eye, target) in eyes.items():
        camera = Camera(look_at(eye, target), K, width, height)
        view = {"viewmat": torch.from_numpy(camera.w2c).float(), "K": torch.from_numpy(K).float()}
        scenes[f"{path.stem} {where}"] = {**model, **view}
    return scenes


def on_device(scene: dict, device) -> dict:
    """`scene`'s tensors on `device`, the Gaussians' requiring grad."""
    out = {k: v.to(device) if torch.is_tensor(v) else v for k, v in scene.items()}
    for k in ("means", "quats", "scales", "opacities", "sh"):
        out[k].requires_grad_(True)
    return out


def ours(scene: dict, width: int, height: int):
    out = cuda.rasterize(scene["means"], scene["quats"], scene["scales"], scene["opacities"], scene["sh"],
                         scene["viewmat"], scene["K"], width, height, scene["sh_degree"], scene["background"])
    return out.image, out.means2d


def ours_blender(scene: dict, width: int, height: int):
    """Ours in Blender's image formation (render/formation.py)."""
    out = cuda.rasterize_blender(scene["means"], scene["quats"], scene["scales"], scene["opacities"], scene["sh"],
                                 scene["viewmat"], scene["K"], width, height, scene["sh_degree"], scene["background"])
    return out.image, out.means2d


def peer(scene: dict, width: int, height: int):
    import gsplat
    image, _, meta = gsplat.rasterization(
        scene["means"], scene["quats"], scene["scales"], scene["opacities"], scene["sh"], scene["viewmat"][None],
        scene["K"][None], width, height, near_plane=NEAR_PLANE, radius_clip=0.0, eps2d=DILATION,
        sh_degree=scene["sh_degree"],
        packed=False, tile_size=TILE, backgrounds=scene["background"][None], render_mode="RGB",
        rasterize_mode="classic")
    means2d = meta["means2d"]
    if means2d.requires_grad:
        means2d.retain_grad()
    return image[0], means2d


def median_ms(fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def time_renderer(render, scene, width, height, grad_image, warmup, reps) -> dict:
    params = [scene[k] for k in ("means", "quats", "scales", "opacities", "sh")]

    def forward():
        render(scene, width, height)

    def forward_backward():
        for p in params:
            p.grad = None
        image, _ = render(scene, width, height)
        image.backward(grad_image)

    return {"fwd_ms": median_ms(forward, warmup, reps), "fwd_bwd_ms": median_ms(forward_backward, warmup, reps)}


def gsplat_version() -> str | None:
    try:
        import gsplat
    except ImportError:
        return None
    return getattr(gsplat, "__version__", "unknown")


def markdown(result: dict) -> str:
    lines = [f"# Rasterizer benchmark, {result['date']}", "",
             f"GPU: {result['gpu']}; torch {result['torch']}; gsplat {result['gsplat'] or 'not installed'}; "
             f"commit {result['commit']}", "",
             "Median ms (CUDA events, after warm-up), float32, SH degree 3 (a stored model: its own). fwd+bwd = "
             "forward + image backward.", "",
             "| scene | tile entries | ours fwd | ours fwd+bwd | gsplat fwd | gsplat fwd+bwd | fwd ratio | fwd+bwd ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in result["rows"]:
        g = row.get("gsplat")

        def fmt(v):
            return f"{v:.2f}" if v is not None else "-"
        lines.append(f"| {row['scene']} | {row['tile_entries']:,} | {fmt(row['ours']['fwd_ms'])} | "
                     f"{fmt(row['ours']['fwd_bwd_ms'])} | {fmt(g and g['fwd_ms'])} | {fmt(g and g['fwd_bwd_ms'])} | "
                     f"{fmt(row.get('ratio_fwd'))} | {fmt(row.get('ratio_fwd_bwd'))} |")
    lines += ["", "ratio = ours / gsplat (below 1: ours is faster)."]
    blender = [row for row in result["rows"] if "ours_blender" in row]
    if blender:
        lines += ["", "Ours in Blender's image formation (--blender), against ours in the standard one:", "",
                  "| scene | fwd | fwd+bwd | fwd+bwd / standard's |", "| --- | ---: | ---: | ---: |"]
        lines += [f"| {row['scene']} | {row['ours_blender']['fwd_ms']:.2f} | {row['ours_blender']['fwd_bwd_ms']:.2f} | "
                  f"{row['blender_over_standard']:.2f} |" for row in blender]
    return "\n".join(lines) + "\n"


def frame_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give the size as WIDTHxHEIGHT, e.g. 1920x1080") from None
    if width < 1 or height < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the width and height must be positive")
    return width, height


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m backend bench raster", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--ply", type=Path, action="append", default=[], metavar="FILE",
                    help="also a stored splat model (any format the backend reads), from outside and from within")
    ap.add_argument("--size", type=frame_size, default=(1920, 1080), metavar="WIDTHxHEIGHT",
                    help="the stored models' frame size (default 1920x1080)")
    # A small scene's render is bound by the host, whose speed wanders: on one H200, ours at 100k Gaussians took
    # 1.26 ms (median of 25 after 5 warm-up runs) in one run and 0.86 ms (50 after 20) in the next. More runs
    # steady the median of both renderers for a few seconds more.
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-gsplat", action="store_true", help="time only ours")
    ap.add_argument("--blender", action="store_true",
                    help="also time ours in Blender's image formation, against ours in the standard one")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    stored = {}  # read before anything is built, so a file that cannot be read stops the run at once
    for path in args.ply:
        if not path.is_file():
            ap.error(f"--ply {path}: no such file")
        try:
            stored.update(model_scenes(path, *args.size))
        except SplatwrightError as e:
            ap.error(f"--ply {e}")

    if not torch.cuda.is_available():
        print("bench raster needs a CUDA GPU; torch sees none")
        return 1
    print("building/loading the CUDA extension ...", flush=True)
    extension()
    with_gsplat = not args.no_gsplat and gsplat_version() is not None
    if not args.no_gsplat and not with_gsplat:
        print("gsplat is not importable: timing ours only", flush=True)
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name()
    # (name, a function making the scene, its frame size)
    scenes = [(name, lambda name=name: make_scene(*SIZES[name], args.seed, device), SIZES[name][1:3])
              for name in args.sizes]
    scenes += [(f"{name}@{args.size[0]}x{args.size[1]}", lambda scene=scene: on_device(scene, device), args.size)
               for name, scene in stored.items()]
    rows = []
    for name, make, (width, height) in scenes:
        print(f"[{name}] making the scene ...", flush=True)
        scene = make()
        n = len(scene["means"])
        grad_image = torch.randn(height, width, 3, device=device,
                                 generator=torch.Generator(device=device).manual_seed(args.seed))
        with torch.no_grad():
            out = cuda.rasterize(scene["means"], scene["quats"], scene["scales"], scene["opacities"], scene["sh"],
                                 scene["viewmat"], scene["K"], width, height, scene["sh_degree"], scene["background"])
            bins = cuda.project_and_bin(scene["means"], scene["quats"], scene["scales"], scene["opacities"],
                                        scene["sh"], scene["viewmat"], scene["K"], width, height, scene["sh_degree"])
            entries = len(bins.gauss_ids)
        row = {"scene": name, "gaussians": n, "width": width, "height": height, "sh_degree": scene["sh_degree"],
               "tile_entries": entries,
               "visible": int((out.radii > 0).sum())}
        print(f"[{name}] {row['visible']:,} visible, {entries:,} tile entries; timing ours ...", flush=True)
        row["ours"] = time_renderer(ours, scene, width, height, grad_image, args.warmup, args.reps)
        print(f"[{name}] ours: fwd {row['ours']['fwd_ms']:.2f} ms, fwd+bwd {row['ours']['fwd_bwd_ms']:.2f} ms",
              flush=True)
        if args.blender:
            row["ours_blender"] = time_renderer(ours_blender, scene, width, height, grad_image, args.warmup, args.reps)
            row["blender_over_standard"] = row["ours_blender"]["fwd_bwd_ms"] / row["ours"]["fwd_bwd_ms"]
            print(f"[{name}] ours in Blender's formation: fwd {row['ours_blender']['fwd_ms']:.2f} ms, fwd+bwd "
                  f"{row['ours_blender']['fwd_bwd_ms']:.2f} ms ({row['blender_over_standard']:.2f}x)", flush=True)
        if with_gsplat:
            with torch.no_grad():
                peer_image, _ = peer(scene, width, height)
                row["image_mean_abs_diff_vs_gsplat"] = (peer_image - out.image).abs().mean().item()
            print(f"[{name}] timing gsplat (mean |image diff| {row['image_mean_abs_diff_vs_gsplat']:.2e}) ...",
                  flush=True)
            row["gsplat"] = time_renderer(peer, scene, width, height, grad_image, args.warmup, args.reps)
            row["ratio_fwd"] = row["ours"]["fwd_ms"] / row["gsplat"]["fwd_ms"]
            row["ratio_fwd_bwd"] = row["ours"]["fwd_bwd_ms"] / row["gsplat"]["fwd_bwd_ms"]
            print(f"[{name}] gsplat: fwd {row['gsplat']['fwd_ms']:.2f} ms, fwd+bwd {row['gsplat']['fwd_bwd_ms']:.2f}"
                  f" ms; ours/gsplat fwd {row['ratio_fwd']:.3f}, fwd+bwd {row['ratio_fwd_bwd']:.3f}", flush=True)
        rows.append(row)
        del scene, out
        torch.cuda.empty_cache()

    now = datetime.datetime.now(datetime.timezone.utc)
    result = {"benchmark": "raster", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "gpu": gpu,
              "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
              "gsplat": gsplat_version() if with_gsplat else None, "commit": git_commit(),
              "warmup": args.warmup, "reps": args.reps, "seed": args.seed, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"raster-{now.strftime('%Y%m%d-%H%M')}-{gpu.replace(' ', '_')}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    (args.out / f"{stem}.md").write_text(table)
    print(f"wrote {args.out / stem}.json and .md\n")
    print(table)
    return 0 if all(math.isfinite(r["ours"]["fwd_bwd_ms"]) for r in rows) else 1

"""The image formations against Blender's own drawing of native splats: a model rendered by Blender 5.3 (Cycles on
the CPU, optionally EEVEE; blender_formation.py in a bpy 5.3 process) and by our reference rasterizer in each image
formation (backend/render/formation.py), through the same cameras, compared in display values (the Standard view
transform's sRGB). Two Cycles renders with different seeds give the Monte Carlo noise floor beside the figures.

With --train STEPS it also trains in each formation on Cycles' renders of the model (a capture from Cycles, with
Blender's default film filter) and scores each trained model on held-out views against Cycles' renders of the
capture: our render of it, and Blender's own (Cycles) render of it as a native splat object, the way the add-on on
Blender 5.3 shows it.

    python -m backend bench formation [--model PLY] [--views 4] [--size 128] [--samples 256]
        [--filter-widths 1.5,0.01] [--eevee] [--train STEPS [--train-views 16] [--train-size 64]
        [--native-samples 1024] [--view-transforms Standard,AgX]]
        [--python BPY53_PYTHON] [--out DIR]

--python names a Python whose `bpy` is 5.3 or later (default $SPLATWRIGHT_BPY53, else python3.13). Writes
formation-<date>.json and .md into --out (default bench/results).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from blender_addon.core.cameras import BLENDER_TO_OPENCV, Camera, blender_lens, intrinsics, look_at
from blender_addon.core.settings import training_settings
from ...data.dataset import Dataset
from ...data.images import quantise
from ...formats import read_any
from ...formats.ply import write_ply
from ...gaussians import Gaussians
from ...policy import make_config
from ...render import camera_tensors, reference
from ...train import Trainer
from ...render.formation import FORMATIONS, linear_to_srgb, srgb_to_linear
from . import RESULTS, ROOT, git_commit, model_extent, write_results

SCENARIO = Path(__file__).resolve().parent / "blender_formation.py"
DONUT = ROOT.parent / "shared" / "data" / "splats" / "donut_sh0.ply"


def orbit(centre, radius: float, n: int, size: int, elevation: float = 0.6, fov: float = 0.7,
          phase: float = 0.3) -> list[Camera]:
    """n square cameras around `centre` at `elevation` radians above it, the model's `radius` filling the view."""
    distance = 1.15 * radius / math.sin(0.5 * fov)
    f = 0.5 * size / math.tan(0.5 * fov)
    cams = []
    for k in range(n):
        a = phase + 2 * math.pi * k / n
        eye = np.asarray(centre) + distance * np.array([math.cos(elevation) * math.cos(a),
                                                        math.cos(elevation) * math.sin(a), math.sin(elevation)])
        cams.append(Camera(look_at(eye, centre), intrinsics(f, f, 0.5 * size, 0.5 * size), size, size))
    return cams


def blender_camera(cam: Camera) -> dict:
    """A camera as blender_formation.py places it (core/cameras.py's conversion)."""
    lens, size = blender_lens(cam.K, cam.width, cam.height)
    return {"c2w": (cam.c2w @ BLENDER_TO_OPENCV).tolist(), "lens": lens.lens, "sensor_width": lens.sensor_width,
            "sensor_height": lens.sensor_height, "sensor_fit": lens.sensor_fit, "shift_x": lens.shift_x,
            "shift_y": lens.shift_y, "width": cam.width, "height": cam.height,
            "pixel_aspect_x": size.pixel_aspect_x, "pixel_aspect_y": size.pixel_aspect_y}


def blender_renders(python: str, ply: Path, cameras: list[Camera], renders: list[dict], background,
                    work: Path, view_transforms: tuple[str, ...] = (), linear_arrays: tuple[Path, ...] = ()
                    ) -> tuple[dict[str, list[np.ndarray]], dict]:
    """Blender's renders of `ply` through `cameras`, in display values (H, W, 3) per render name and view, and
    what blender_formation.py reported. With `view_transforms`, also each render's display values under each, as
    "<name> <transform>"; the .npy files of `linear_arrays` get theirs beside them (blender_formation.py)."""
    job = {"ply": str(ply), "background": [float(c) for c in srgb_to_linear(torch.tensor(background))],
           "out": str(work / "blender"), "cameras": [blender_camera(c) for c in cameras], "renders": renders,
           "view_transforms": list(view_transforms), "display": [str(a) for a in linear_arrays]}
    (work / "job.json").write_text(json.dumps(job))
    run = subprocess.run([python, str(SCENARIO), str(work / "job.json")], capture_output=True, text=True,
                         timeout=7200)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"{python} {SCENARIO.name} failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    if run.returncode:  # Blender 5.3 may crash while it exits after EEVEE's renders (Mesa's lavapipe), all written
        print(f"warning: {SCENARIO.name} exited with code {run.returncode} after its results were written")
    images = {r["name"]: [display(np.load(work / f"blender_{r['name']}_{i}.npy")) for i in range(len(cameras))]
              for r in renders}
    for r in renders:
        for t in view_transforms:
            images[f"{r['name']} {t}"] = [np.load(work / f"blender_{r['name']}_{i}_{t}.npy")
                                          for i in range(len(cameras))]
    return images, json.loads(lines[-1][len("RESULT "):])


def display(linear_rgba: np.ndarray) -> np.ndarray:
    """The Standard view transform's display values of a linear render, clipped to [0, 1] as an 8-bit file is."""
    return linear_to_srgb(torch.from_numpy(linear_rgba[..., :3].astype(np.float64)).clamp(0, 1)).numpy()


def our_render(g: Gaussians, cam: Camera, background, formation: str) -> np.ndarray:
    viewmat, K = camera_tensors(cam, "cpu", torch.float64)
    g = g.to(dtype=torch.float64)
    with torch.no_grad():
        out = reference.rasterize(g.means, g.quats, torch.exp(g.log_scales), g.opacities, g.sh, viewmat, K,
                                  cam.width, cam.height, g.max_sh_degree, background, formation)
    return out.image.clamp(0, 1).numpy()


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(-10 * np.log10(max(np.mean((a - b) ** 2), 1e-12)))


def mean_psnr(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    return float(np.mean([psnr(a, b) for a, b in zip(ours, theirs)]))


def pixel_sizes(g: Gaussians, cameras: list[Camera]) -> np.ndarray:
    """Each Gaussian's largest standard deviation in pixels where it is seen largest: in the nearest of `cameras`
    (relative to their focal lengths) that has it in front (Mip-Splatting's sampling rate of a Gaussian)."""
    means = g.means.detach().double().numpy()
    largest = np.exp(g.log_scales.detach().double().numpy()).max(axis=1)
    best = np.zeros(len(means))
    for cam in cameras:
        _, z = cam.world_to_pixel(means)
        best = np.maximum(best, np.where(z > 0, cam.K[0, 0] * largest / np.maximum(z, 1e-9), 0))
    return best


def train_round_trip(args, g: Gaussians, centre, radius: float, background, work: Path) -> dict:
    """Train a model in each formation on Cycles' renders of `g` (the capture, Standard view transform as the
    add-on captures), then score it on held-out views against Cycles' renders under each of --view-transforms:
    our render of it (its display values taken as sRGB-encoded scene-linear light, through the transform), and
    Blender's own renders of it as a native object (Cycles, and EEVEE with --eevee)."""
    half = args.train_views // 2
    train_cams = (orbit(centre, radius, half, args.train_size, elevation=0.35)
                  + orbit(centre, radius, args.train_views - half, args.train_size, elevation=0.9, phase=0.5))
    test_cams = orbit(centre, radius, 4, args.train_size, elevation=0.6, phase=0.3 + math.pi / 4)
    transforms = tuple(args.view_transforms.split(","))
    cycles = {"name": "cycles", "engine": "CYCLES", "samples": args.samples, "filter_width": 1.5, "seed": 0}
    native = [{**cycles, "samples": args.native_samples, "seed": 2}]
    if args.eevee:
        native.append({"name": "eevee", "engine": "BLENDER_EEVEE", "samples": 64, "filter_width": 1.5})
    ply = work / "capture.ply"
    write_ply(ply, g)
    truth, _ = blender_renders(args.python, ply, train_cams + test_cams, [cycles], background, work, transforms)
    data = Dataset(train_cams, torch.stack([quantise(torch.from_numpy(t).float())
                                            for t in truth["cycles"][:len(train_cams)]]),
                   [f"{i:03d}" for i in range(len(train_cams))])
    held_out = {t: truth[f"cycles {t}"][len(train_cams):] for t in transforms}
    result = {}
    for formation in FORMATIONS:
        settings = training_settings(iterations=args.train, image_formation=formation, background=list(background),
                                     init_points=args.init_points, max_gaussians=args.max_gaussians)
        trainer = Trainer(data, make_config("cpu", "reference", settings))
        while trainer.step < trainer.cfg.iterations:
            trainer.train_step()
        model = trainer.g.detached()
        ours_linear = []
        for i, c in enumerate(test_cams):
            ours_linear.append(work / f"ours_{formation}_{i}.npy")
            np.save(ours_linear[-1], srgb_to_linear(torch.from_numpy(our_render(model, c, background, formation)))
                    .float().numpy())
        write_ply(work / f"trained_{formation}.ply", model)
        renders, _ = blender_renders(args.python, work / f"trained_{formation}.ply", test_cams, native, background,
                                     work, transforms, tuple(ours_linear))
        sizes = pixel_sizes(model, train_cams)
        scores = {}
        for t in transforms:
            ours = [np.load(a.with_name(f"{a.stem}_{t}.npy")) for a in ours_linear]
            scores[t] = {"ours_vs_truth": mean_psnr(ours, held_out[t])}
            for r in native:
                scores[t][f"{r['name']}_vs_truth"] = mean_psnr(renders[f"{r['name']} {t}"], held_out[t])
                scores[t][f"{r['name']}_vs_ours"] = mean_psnr(renders[f"{r['name']} {t}"], ours)
        result[formation] = {"gaussians": len(model), "train_seconds": trainer.train_seconds,
                             "sub_pixel": float(np.mean(sizes < 0.5)), "median_pixels": float(np.median(sizes)),
                             "psnr": scores}
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench formation", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=DONUT, help="a splat file (default: the donut PLY in ../shared)")
    p.add_argument("--views", type=int, default=4)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--samples", type=int, default=256, help="Cycles' samples per pixel")
    p.add_argument("--filter-widths", default="1.5,0.01",
                   help="Cycles' pixel filter widths in pixels: 1.5 is Blender's default, 0.01 samples each "
                   "pixel's centre as our rasterizer does")
    p.add_argument("--eevee", action="store_true", help="also EEVEE (slow without a GPU: Mesa's lavapipe)")
    p.add_argument("--background", default="0,0,0", help="the world's colour, display r,g,b")
    p.add_argument("--train", type=int, default=0, metavar="STEPS",
                   help="also train in each formation on Cycles' renders of the model, this many steps (CPU)")
    p.add_argument("--native-samples", type=int, default=1024,
                   help="Cycles' samples per pixel in its renders of the trained models (their noise is not the "
                   "model's error)")
    p.add_argument("--view-transforms", default="Standard,AgX",
                   help="the trained models are scored in the display values of each of these view transforms")
    p.add_argument("--train-views", type=int, default=16)
    p.add_argument("--train-size", type=int, default=64)
    p.add_argument("--init-points", type=int, default=5000)
    p.add_argument("--max-gaussians", type=int, default=20000)
    p.add_argument("--python", default=os.environ.get("SPLATWRIGHT_BPY53", "python3.13"),
                   help="a Python with bpy 5.3 or later")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    background = tuple(float(c) for c in args.background.split(","))
    g = read_any(args.model)
    centre, radius = model_extent(g.means, 0.98)
    cameras = orbit(centre, radius, args.views, args.size)
    widths = [float(w) for w in args.filter_widths.split(",")]
    renders = [{"name": f"cycles_{w:g}", "engine": "CYCLES", "samples": args.samples, "filter_width": w, "seed": 0}
               for w in widths]
    renders.append({"name": "cycles_noise", "engine": "CYCLES", "samples": args.samples, "filter_width": widths[0],
                    "seed": 1})
    if args.eevee:
        renders.append({"name": "eevee", "engine": "BLENDER_EEVEE", "samples": 64, "filter_width": 1.5})
    with tempfile.TemporaryDirectory(prefix="splatwright-formation-") as work:
        work = Path(work)
        ply = work / "model.ply"
        write_ply(ply, g)
        theirs, info = blender_renders(args.python, ply, cameras, renders, background, work)
        trained = train_round_trip(args, g, centre, radius, background, work) if args.train else None
    ours = {f: [our_render(g, c, background, f) for c in cameras] for f in FORMATIONS}
    table = {r["name"]: {f: mean_psnr(ours[f], theirs[r["name"]]) for f in FORMATIONS} for r in renders
             if r["name"] != "cycles_noise"}
    noise = mean_psnr(theirs["cycles_noise"], theirs[renders[0]["name"]])
    eevee = mean_psnr(theirs["eevee"], theirs[renders[0]["name"]]) if args.eevee else None
    now = datetime.datetime.now(datetime.timezone.utc)
    result = {"benchmark": "formation", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
              "model": args.model.name, "splats": len(g), "views": args.views, "size": args.size,
              "samples": args.samples, "background": background, "blender": info["blender"],
              "blender_seconds": info["seconds"], "psnr": table, "cycles_noise_psnr": noise, "eevee_vs_cycles_psnr": eevee,
              "trained": trained}
    rows = [f"| {name} | " + " | ".join(f"{table[name][f]:.2f}" for f in FORMATIONS) + " |" for name in table]
    report = "\n".join([
        f"Image formations against Blender {info['blender']}'s native splats: {args.model.name} ({len(g)} splats), "
        f"{args.views} views of {args.size}x{args.size}, world {args.background}, Standard view transform; "
        f"commit {result['commit']}, {result['date']}", "",
        "Mean PSNR (dB) of our reference render in each formation against Blender's render:", "",
        "| Blender render | " + " | ".join(FORMATIONS) + " |", "|---|" + "---|" * len(FORMATIONS), *rows, "",
        f"Cycles: {args.samples} samples on the CPU, filter width as named. Two Cycles renders with different seeds "
        f"agree at {noise:.2f} dB (the Monte Carlo noise floor)."])
    if eevee is not None:
        report += (f" EEVEE (64 samples, filter size 1.5; its splats quantised, with the 0.3 px dilation) against "
                   f"Cycles ({renders[0]['name']}): {eevee:.2f} dB.")
    if trained:
        engines = ["cycles"] + (["eevee"] if args.eevee else [])
        rows = []
        for f, r in trained.items():
            for t, scores in r["psnr"].items():
                rows.append(f"| {f} | {t} | {r['gaussians']} | {100 * r['sub_pixel']:.0f}% | {r['median_pixels']:.2f} "
                            f"| {scores['ours_vs_truth']:.2f} | "
                            + " | ".join(f"{scores[e + '_vs_truth']:.2f} | {scores[e + '_vs_ours']:.2f}"
                                         for e in engines) + " |")
        report += "\n".join([
            "", "", f"Trained in each formation for {args.train} steps (CPU schedule, {args.init_points} random "
            f"initial Gaussians, at most {args.max_gaussians}) on Cycles' renders of the model ({args.train_views} "
            f"views of {args.train_size}x{args.train_size}, {args.samples} samples, filter width 1.5, Standard view "
            "transform), scored on 4 held-out views against Cycles' renders of them (the truth) in the display values "
            f"of each view transform (mean PSNR, dB). Blender's renders of the trained models: Cycles at "
            f"{args.native_samples} samples" + (", EEVEE at 64" if args.eevee else "") + ".", "",
            "| trained in | view transform | Gaussians | under 0.5 px | median px | ours vs truth | "
            + " | ".join(f"{e} vs truth | {e} vs ours" for e in engines) + " |",
            "|---|---|---|---|---|---|" + "---|---|" * len(engines), *rows, "",
            "Ours: our render's display values taken as sRGB-encoded scene-linear light, through the view transform "
            "(under Standard, our render as it is). Under 0.5 px: the Gaussians whose largest deviation is under half "
            "a pixel in the training view that sees them largest; median px: that size's median."])
    write_results(args.out, f"formation-{now.strftime('%Y%m%d-%H%M')}", result, report)
    return 0

"""The image formations against Blender's own drawing of native splats: a model rendered by Blender 5.3 (Cycles on
the CPU, optionally EEVEE; blender_formation.py in a bpy 5.3 process) and by our reference rasterizer in each image
formation (backend/render/formation.py), through the same cameras, compared in display values (the Standard view
transform's sRGB). Two Cycles renders with different seeds give the Monte Carlo noise floor beside the figures.

With --train STEPS it also trains in each formation on Cycles' renders of the model (a capture from Cycles, with
Blender's default film filter) and scores each trained model on held-out views against Cycles' renders of the
capture: our render of it, and Blender's own (Cycles) render of it as a native splat object, the way the add-on on
Blender 5.3 shows it.

With --train-4d STEPS, the 4D bar: Cycles captures the model moving (turning and sliding over --frames frames); a 4D
model trained on that in the blender formation (CPU) is put in a Blender scene as Add Model to Scene puts one, and
Blender's F12 of it at the first and last frames is scored, against Cycles' capture of those frames from held-out
cameras, beside our render of it at times 0 and 1: within 0.5 dB of ours, it passes.

    python -m backend bench formation [--model PLY] [--views 4] [--size 128] [--samples 256]
        [--filter-widths 1.5,0.01] [--eevee] [--train STEPS [--train-views 16] [--train-size 64]
        [--native-samples 1024] [--view-transforms Standard,AgX]] [--train-4d STEPS [--frames 5]]
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
from blender_addon.logic.dataset import frame_time
from ...data.dataset import Dataset
from ...data.images import quantise
from ...formats import read_any
from ...formats.ply import write_ply
from ...gaussians import Gaussians
from ...policy import make_config
from ...render import camera_tensors, reference
from ...train import Trainer
from ...render.formation import BLENDER, FORMATIONS, linear_to_srgb, srgb_to_linear
from ...service.exports import motion_ply_bytes
from ..progress import Progress
from . import RESULTS, ROOT, git_commit, model_extent, train_until, write_results

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


def blender_renders(python: str, ply: Path | None, cameras: list[Camera], renders: list[dict], background,
                    work: Path, view_transforms: tuple[str, ...] = (), linear_arrays: tuple[Path, ...] = (),
                    frames: list[int] | None = None, scene: dict | None = None
                    ) -> tuple[dict[str, list[np.ndarray]], dict]:
    """Blender's renders of `ply` through `cameras`, in display values (H, W, 3) per render name and view, and
    what blender_formation.py reported. With `view_transforms`, also each render's display values under each, as
    "<name> <transform>"; the .npy files of `linear_arrays` get theirs beside them (blender_formation.py).
    `frames`: each camera's frame; `scene`: the job's other keys (a 4D model's "motion_ply" in place of `ply`,
    the "frame_range", the "keys" that move the imported model)."""
    job = {**({"ply": str(ply)} if ply is not None else {}), **(scene or {}),
           "background": [float(c) for c in srgb_to_linear(torch.tensor(background))],
           "out": str(work / "blender"), "cameras": [blender_camera(c) for c in cameras], "renders": renders,
           "view_transforms": list(view_transforms), "display": [str(a) for a in linear_arrays]}
    for c, frame in zip(job["cameras"], frames or []):
        c["frame"] = frame
    (work / "job.json").write_text(json.dumps(job))
    run = subprocess.run([python, str(SCENARIO), str(work / "job.json")], capture_output=True, text=True,
                         timeout=7200, env={**os.environ, "PYTHONPATH": str(ROOT)})
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


def bench_cameras(centre, radius: float, args) -> tuple[list[Camera], list[Camera]]:
    """The training cameras (--train-views of --train-size, on two rings) and the 4 held-out ones between them."""
    half = args.train_views // 2
    train_cams = (orbit(centre, radius, half, args.train_size, elevation=0.35)
                  + orbit(centre, radius, args.train_views - half, args.train_size, elevation=0.9, phase=0.5))
    return train_cams, orbit(centre, radius, 4, args.train_size, elevation=0.6, phase=0.3 + math.pi / 4)


def bench_renders(args) -> tuple[dict, list[dict]]:
    """Blender's render of the capture (the truth) and its renders of a trained model (Cycles, EEVEE with --eevee)."""
    cycles = {"name": "cycles", "engine": "CYCLES", "samples": args.samples, "filter_width": 1.5, "seed": 0}
    native = [{**cycles, "samples": args.native_samples, "seed": 2}]
    if args.eevee:
        native.append({"name": "eevee", "engine": "BLENDER_EEVEE", "samples": 64, "filter_width": 1.5})
    return cycles, native


def views(truth: list[np.ndarray], cameras: list[Camera], times: list[float] | None = None) -> Dataset:
    """Blender's renders as training views, 8-bit as captured."""
    return Dataset(cameras, torch.stack([quantise(torch.from_numpy(t).float()) for t in truth]),
                   [f"{i:03d}" for i in range(len(cameras))], times)


def saved_linear(images: list[np.ndarray], prefix: Path) -> list[Path]:
    """Our renders (display values) as linear .npy files PREFIX_<i>.npy, for Blender to give their display values
    under each view transform (blender_renders' `linear_arrays`)."""
    paths = [prefix.with_name(f"{prefix.name}_{i}.npy") for i in range(len(images))]
    for path, image in zip(paths, images):
        np.save(path, srgb_to_linear(torch.from_numpy(image)).float().numpy())
    return paths


def scored(ours_linear: list[Path], renders: dict, native: list[dict], truth: dict, transforms) -> dict:
    """Mean PSNRs under each view transform: our renders (saved_linear's) and Blender's `native` renders against
    `truth` (the held-out views by transform), and Blender's against ours."""
    scores = {}
    for t in transforms:
        ours = [np.load(a.with_name(f"{a.stem}_{t}.npy")) for a in ours_linear]
        scores[t] = {"ours_vs_truth": mean_psnr(ours, truth[t])}
        for r in native:
            scores[t][f"{r['name']}_vs_truth"] = mean_psnr(renders[f"{r['name']} {t}"], truth[t])
            scores[t][f"{r['name']}_vs_ours"] = mean_psnr(renders[f"{r['name']} {t}"], ours)
    return scores


def train_model(data: Dataset, args, steps: int, formation: str, background, what: str):
    """A model trained on `data` in `formation` on the CPU (the reference rasterizer), and its trainer."""
    settings = training_settings(iterations=steps, image_formation=formation, background=list(background),
                                 init_points=args.init_points, max_gaussians=args.max_gaussians)
    trainer = Trainer(data, make_config("cpu", "reference", settings))
    bar = Progress(trainer.cfg.iterations, what)
    train_until(trainer, trainer.cfg.iterations, bar)
    bar.close()
    return trainer.g.detached(), trainer


def train_round_trip(args, g: Gaussians, centre, radius: float, background, work: Path) -> dict:
    """Train a model in each formation on Cycles' renders of `g` (the capture, Standard view transform as the
    add-on captures), then score it on held-out views against Cycles' renders under each of --view-transforms:
    our render of it (its display values taken as sRGB-encoded scene-linear light, through the transform), and
    Blender's own renders of it as a native object (Cycles, and EEVEE with --eevee)."""
    train_cams, test_cams = bench_cameras(centre, radius, args)
    transforms = tuple(args.view_transforms.split(","))
    cycles, native = bench_renders(args)
    ply = work / "capture.ply"
    write_ply(ply, g)
    truth, _ = blender_renders(args.python, ply, train_cams + test_cams, [cycles], background, work, transforms)
    data = views(truth["cycles"][:len(train_cams)], train_cams)
    held_out = {t: truth[f"cycles {t}"][len(train_cams):] for t in transforms}
    result = {}
    for formation in FORMATIONS:
        model, trainer = train_model(data, args, args.train, formation, background, f"train {formation}")
        ours_linear = saved_linear([our_render(model, c, background, formation) for c in test_cams],
                                   work / f"ours_{formation}")
        write_ply(work / f"trained_{formation}.ply", model)
        renders, _ = blender_renders(args.python, work / f"trained_{formation}.ply", test_cams, native, background,
                                     work, transforms, tuple(ours_linear))
        sizes = pixel_sizes(model, train_cams)
        result[formation] = {"gaussians": len(model), "train_seconds": trainer.train_seconds,
                             "sub_pixel": float(np.mean(sizes < 0.5)), "median_pixels": float(np.median(sizes)),
                             "psnr": scored(ours_linear, renders, native, held_out, transforms)}
    return result


MOTION_TURN = 0.6  # the moving capture: the model turns this many radians about the vertical through its centre
MOTION_SHIFT = 0.4  # ... and moves this many of its radii along x, over the frame range
BAR_DB = 0.5  # the 4D bar: Blender's F12 of the native 4D object within this of our render, against the truth


def moving_keys(centre, radius: float, frames: int) -> dict[int, list]:
    """The moving capture's world matrix of the model at each frame 1..`frames`: turned and moved in proportion to
    the frame's time (MOTION_TURN, MOTION_SHIFT)."""
    keys = {}
    for frame in range(1, frames + 1):
        t = frame_time(frame, 1, frames)
        c, s = math.cos(MOTION_TURN * t), math.sin(MOTION_TURN * t)
        m = np.eye(4)
        m[:3, :3] = [[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]
        m[:3, 3] = np.asarray(centre) + [MOTION_SHIFT * radius * t, 0.0, 0.0] - m[:3, :3] @ np.asarray(centre)
        keys[frame] = m.tolist()
    return keys


def moving_round_trip(args, g: Gaussians, centre, radius: float, background, work: Path) -> dict:
    """The 4D bar: Cycles' renders of `g` moving over frames 1..--frames (moving_keys), through the training
    cameras at every frame and the held-out ones at the first and last; a 4D model trained in the blender
    formation on the training views, each at its frame's time (CPU); Blender's F12 of it as a native 4D object
    (put in the scene as Add Model to Scene puts one) at the first and last frames, and our renders of it at
    times 0 and 1, scored against Cycles' renders of those frames under each of --view-transforms."""
    frames = list(range(1, args.frames + 1))
    ends = (frames[0], frames[-1])
    train_cams, test_cams = bench_cameras(np.asarray(centre) + [0.5 * MOTION_SHIFT * radius, 0.0, 0.0],
                                          (1 + 0.5 * MOTION_SHIFT) * radius, args)
    transforms = tuple(args.view_transforms.split(","))
    cycles, native = bench_renders(args)
    cameras = [c for _ in frames for c in train_cams] + [c for _ in ends for c in test_cams]
    at = [f for f in frames for _ in train_cams] + [f for f in ends for _ in test_cams]
    n = len(frames) * len(train_cams)
    ply = work / "capture.ply"
    write_ply(ply, g)
    span = {"frame_range": list(ends)}
    truth, _ = blender_renders(args.python, ply, cameras, [cycles], background, work, transforms, frames=at,
                               scene={**span, "keys": moving_keys(centre, radius, args.frames)})
    data = views(truth["cycles"][:n], cameras[:n], [frame_time(f, *ends) for f in at[:n]])
    model, trainer = train_model(data, args, args.train_4d, BLENDER, background, "train 4D (blender)")
    motion_ply = work / "trained_4d.ply"
    motion_ply.write_bytes(motion_ply_bytes(model, BLENDER))
    ours_linear = saved_linear([our_render(model.at(frame_time(f, *ends)), c, background, BLENDER)
                                for c, f in zip(cameras[n:], at[n:])], work / "ours_4d")
    renders, _ = blender_renders(args.python, None, cameras[n:], native, background, work, transforms,
                                 tuple(ours_linear), frames=at[n:], scene={**span, "motion_ply": str(motion_ply)})
    held_out = {t: truth[f"cycles {t}"][n:] for t in transforms}
    k = len(test_cams)
    psnr = {}
    for end, part in (("first", slice(0, k)), ("last", slice(k, 2 * k))):
        psnr[end] = scored(ours_linear[part], {name: v[part] for name, v in renders.items()}, native,
                           {t: v[part] for t, v in held_out.items()}, transforms)
    return {"frames": args.frames, "train_views": n, "steps": trainer.step, "gaussians": len(model),
            "train_seconds": trainer.train_seconds, "psnr": psnr}


def moving_bars(moving: dict) -> list[tuple[str, bool]]:
    """The 4D bar at the first and last frames under each view transform, as (the check with its figures, passed)."""
    bars = []
    for end, by_transform in moving["psnr"].items():
        for t, s in by_transform.items():
            bars.append((f"{end} frame, {t}: Cycles' F12 {s['cycles_vs_truth']:.2f} dB, ours {s['ours_vs_truth']:.2f} "
                         f"dB against the truth (within {BAR_DB} dB)",
                         s["cycles_vs_truth"] >= s["ours_vs_truth"] - BAR_DB))
    return bars


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
    p.add_argument("--train-4d", type=int, default=0, metavar="STEPS",
                   help="also the 4D bar: train a 4D model in the blender formation on Cycles' renders of the model "
                   "moving over --frames frames, this many steps (CPU), and score Blender's F12 of it as a native 4D "
                   "object at the first and last frames")
    p.add_argument("--frames", type=int, default=5, help="the moving capture's frames (--train-4d)")
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
        moving = moving_round_trip(args, g, centre, radius, background, work) if args.train_4d else None
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
              "trained": trained, "moving": moving,
              "moving_bars": [{"check": text, "passed": ok} for text, ok in moving_bars(moving)] if moving else None}
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
    engines = ["cycles"] + (["eevee"] if args.eevee else [])
    if trained:
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
    if moving:
        rows = [f"| {end} ({frame}) | {t} | {scores['ours_vs_truth']:.2f} | "
                + " | ".join(f"{scores[e + '_vs_truth']:.2f} | {scores[e + '_vs_ours']:.2f}" for e in engines) + " |"
                for (end, by_transform), frame in zip(moving["psnr"].items(), (1, args.frames))
                for t, scores in by_transform.items()]
        report += "\n".join([
            "", "", f"The 4D bar: the model turned {MOTION_TURN} rad about the vertical through its centre and moved "
            f"{MOTION_SHIFT} of its radius along x over frames 1-{args.frames}, captured by Cycles ({args.samples} "
            f"samples) through {args.train_views} cameras at every frame ({moving['train_views']} views of "
            f"{args.train_size}x{args.train_size}); a 4D model trained on them in the blender formation for "
            f"{moving['steps']} steps on the CPU ({moving['gaussians']} Gaussians, {moving['train_seconds']:.0f} s), "
            "put in a Blender scene as Add Model to Scene puts one (a native 4D object with the motion modifier), "
            f"rendered (F12) at the first and last frames by Cycles at {args.native_samples} samples"
            + (" and EEVEE at 64" if args.eevee else "") + "; ours: our render of it at times 0 and 1. Scored on 4 "
            "held-out cameras against Cycles' renders of the capture at those frames (mean PSNR, dB).", "",
            "| frame | view transform | ours vs truth | " + " | ".join(f"{e} vs truth | {e} vs ours" for e in engines)
            + " |", "|---|---|---|" + "---|---|" * len(engines), *rows, "", "Bar (Cycles' F12 within "
            f"{BAR_DB} dB of ours):", *[f"- {'pass' if ok else 'FAIL'}: {text}" for text, ok in moving_bars(moving)]])
    write_results(args.out, f"formation-{now.strftime('%Y%m%d-%H%M')}", result, report)
    return 0

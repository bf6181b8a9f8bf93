"""`python -m backend bench train`: train on a scene (lego unless told) with our trainer and, where gsplat is
importable, with gsplat's simple_trainer recipe (its defaults, initialisation and strategy, on the same data)
in the same run."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from ...data import LEGO, load_split, scene_point_cloud
from ...data.dataset import Dataset
from ...data.images import parse_background
from ...gaussians import Gaussians
from ...metrics import photometric_loss
from ...policy import PRESETS
from ...render.formation import FORMATIONS, STANDARD
from ...render import camera_tensors
from ...train import (Trainer, TrainConfig, evaluate, fit_to_views, load_checkpoint, random_start, score, warm_up,
                      with_steps)
from ..progress import Progress
from . import RESULTS, git_commit, train_until
from .scaling import scaling


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench train")
    p.add_argument("--data", default=str(LEGO))
    p.add_argument("--preset", default="quality", choices=sorted(PRESETS))
    p.add_argument("--iters", type=int, default=None, help="override the preset's step count")
    p.add_argument("--peer", default="shipped", choices=["shipped", "reset", "both", "none"],
                   help="the gsplat loop with its DefaultStrategy as shipped, with opacity resets made by the loop "
                        "(gsplat 1.5.3's strategy never resets: its test `step %% reset_every == 0 & step > 0` is "
                        "always false), both, or no peer")
    p.add_argument("--peer-steps", type=int, default=None,
                   help="the peer's step count (default: 7000 against the fast preset, else 30000, simple_trainer's "
                        "evaluation points)")
    p.add_argument("--background", type=parse_background, default=None,
                   help="white, black or r,g,b: what both trainers composite over (default: the preset's, white)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="SEED",
                   help="train ours once per seed (view order, splitting, and a random initialisation where the "
                        "scene has no points), the peer with the first; a preset's figure on a scene is a "
                        "distribution, and one run may be its tail")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="train ours N times with the first seed: the run repeats exactly, its time varies")
    p.add_argument("--image-formation", default=None, choices=FORMATIONS,
                   help="the image formation ours trains and is scored in (default: the preset's, standard); the "
                        "peer's is the standard one")
    p.add_argument("--resume-check", action="store_true",
                   help="also train ours stopped halfway, checkpointed and resumed, and compare the two")
    p.add_argument("--gpus", type=int, default=1, metavar="N",
                   help="instead: train on 1 GPU and on N (data-parallel and partitioned), and report the scaling")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="with --gpus: cpu runs N processes on the CPU (the short CPU schedule)")
    args = p.parse_args(argv)
    if args.gpus > 1:
        scaling(args.data, args.gpus, args.device, args.preset, args.iters, args.seeds[0])
        return 0
    if len(set(args.seeds)) < len(args.seeds):
        p.error(f"--seeds {' '.join(map(str, args.seeds))}: each seed once (--repeats N trains one seed N times)")
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: at least 1")
    if not torch.cuda.is_available():
        print("bench train needs a CUDA GPU", file=sys.stderr)
        return 1
    cfg = replace(PRESETS[args.preset], rasterizer="cuda")
    if args.iters:
        cfg = with_steps(cfg, args.iters)
    if args.background:
        cfg = replace(cfg, background=args.background)
    if args.image_formation:
        cfg = replace(cfg, image_formation=args.image_formation)
    cfg = replace(cfg, seed=args.seeds[0])
    train_set = load_split(args.data, "train", cfg.background).to("cuda")
    cfg = fit_to_views(cfg, len(train_set.cameras))  # the schedule as it runs on these views
    test_set = load_split(args.data, "test", cfg.background).to("cuda")
    points = scene_point_cloud(args.data)  # a scene with SfM or surface points starts both trainers on them

    def initial(cfg: TrainConfig) -> Gaussians:
        if points is None:
            return random_start(train_set, cfg)
        return Gaussians.from_point_cloud(points[1], points[2], cfg.sh_degree, "cuda")

    init = initial(cfg)
    warm_ups = {"splatwright": warm_up()}  # as the backend does when it starts
    rows = {"splatwright": run_ours(train_set, test_set, cfg, init)}
    for k in range(2, args.repeats + 1):
        rows[f"splatwright, repeat {k}"] = run_ours(train_set, test_set, cfg, init)
    for seed in args.seeds[1:]:
        seeded = replace(cfg, seed=seed)
        rows[f"splatwright, seed {seed}"] = run_ours(train_set, test_set, seeded, initial(seeded))
    if args.resume_check:
        rows[f"splatwright, resumed at {cfg.iterations // 2}"] = run_ours(train_set, test_set, cfg, init,
                                                                          resume_at=cfg.iterations // 2)
    variants = {"shipped": [False], "reset": [True], "both": [False, True], "none": []}[args.peer]
    if variants and importlib.util.find_spec("gsplat") is None:
        print("gsplat is not importable: peer skipped", file=sys.stderr)
        variants = []
    peer_steps = args.peer_steps or PEER_STEPS.get(args.preset, PEER_DEFAULT_STEPS)
    if variants:
        start = time.perf_counter()
        run_gsplat(train_set, test_set, PEER_WARM_UP_STEPS, cfg.background, cfg.seed, False, points and points[1:])
        warm_ups["gsplat"] = time.perf_counter() - start
    for opacity_reset in variants:
        import gsplat
        name = f"gsplat {gsplat.__version__} simple_trainer" + (" + opacity reset" if opacity_reset else "")
        rows[name] = run_gsplat(train_set, test_set, peer_steps, cfg.background, cfg.seed, opacity_reset,
                                points and points[1:])
    report(rows, cfg, args.preset, Path(args.data).resolve().name, warm_ups, sfm=points is not None)
    return 0


def measure(fn) -> tuple[float, int]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, torch.cuda.max_memory_allocated()


def run_ours(train_set: Dataset, test_set: Dataset, cfg: TrainConfig, init: Gaussians,
             resume_at: int | None = None) -> dict:
    """Train with our trainer; with `resume_at`, stop there, checkpoint, and finish in a new Trainer loaded
    from the checkpoint (the time covers both halves, not the checkpoint's save and load)."""
    trainer = Trainer(train_set, cfg, "cuda", init.detached())
    steps = trainer.cfg.iterations  # cfg's schedule fitted to the views
    bar = Progress(steps, "splatwright")

    seconds, peak = measure(lambda: train_until(trainer, resume_at or steps, bar))
    if resume_at:
        with tempfile.TemporaryDirectory() as folder:
            trainer.save_checkpoint(Path(folder) / "checkpoint.pt")
            trainer = Trainer.from_checkpoint(train_set, load_checkpoint(Path(folder) / "checkpoint.pt"), "cuda", cfg)
        more_seconds, more_peak = measure(lambda: train_until(trainer, steps, bar))
        seconds, peak = seconds + more_seconds, max(peak, more_peak)
    bar.close()
    scores = evaluate(trainer.g, test_set, trainer.sh_degree, cfg.background, "cuda", cfg.image_formation)
    return {"steps": trainer.step, "seconds": seconds, **scores, "gaussians": len(trainer.g), "peak_bytes": peak}


# gsplat 1.5.3's examples/simple_trainer.py as its users run it: init_type "sfm" on a scene with points (COLMAP's,
# or a capture's), else "random"; its Config defaults. Steps: its two evaluation points, 7k against our fast preset, 30k otherwise.
SIMPLE_TRAINER = {"init_num_pts": 100_000, "init_extent": 3.0, "init_opa": 0.1, "means_lr": 1.6e-4,
                  "scales_lr": 5e-3, "opacities_lr": 5e-2, "quats_lr": 1e-3, "sh0_lr": 2.5e-3, "shN_lr": 2.5e-3 / 20,
                  "sh_degree": 3, "sh_degree_interval": 1000, "ssim_lambda": 0.2, "means_lr_final_ratio": 0.01}
PEER_STEPS = {"fast": 7_000}
PEER_DEFAULT_STEPS = 30_000
PEER_WARM_UP_STEPS = 5  # untimed, before the peer's run: its kernels' one-time loading, as ours have warm_up
PEER_RANDOM_INIT = ("random init in a world-axis cube (simple_trainer's cube is in its normalised frame, rotated "
                    "to the cameras' mean up); ")
PEER_DEVIATIONS = (
    "images composited over the dataset's background and rendered with that background "
    "(simple_trainer reads COLMAP photos, which have no alpha); our SSIM in the loss (simple_trainer: fused_ssim)")


def simple_trainer_init(cameras, seed: int, points=None) -> tuple[Gaussians, float]:
    """simple_trainer's initialisation and scene scale: its parser centres the world on the median of each
    camera's forward ray's nearest point to the origin and its scale is 1.1 x the largest distance of a camera
    from their mean; the Gaussians sit on `points` ((N, 3) positions, (N, 3) uint8 colours) where given, else
    fill a cube of half-size init_extent x scale with random colours; random (unnormalised) quaternions,
    opacity 0.1 and scales from the three nearest neighbours."""
    positions = np.stack([c.position for c in cameras])
    forwards = np.stack([c.c2w[:3, 2] for c in cameras])
    nearest = positions - (positions * forwards).sum(1, keepdims=True) * forwards
    center = np.median(nearest, axis=0)
    scene_scale = 1.1 * float(np.linalg.norm(positions - positions.mean(0), axis=1).max())
    gen = torch.Generator().manual_seed(seed)
    if points is None:
        n = SIMPLE_TRAINER["init_num_pts"]
        half = SIMPLE_TRAINER["init_extent"] * scene_scale
        xyz = torch.as_tensor(center, dtype=torch.float32) + half * (torch.rand(n, 3, generator=gen) * 2 - 1)
        rgb = torch.rand(n, 3, generator=gen)
    else:
        xyz, rgb = torch.as_tensor(points[0], dtype=torch.float32), torch.as_tensor(points[1]).float() / 255.0
    g = Gaussians.from_points(xyz.cuda(), rgb.cuda(), SIMPLE_TRAINER["sh_degree"], opacity=SIMPLE_TRAINER["init_opa"])
    g.quats = torch.rand(len(g), 4, generator=gen).cuda()
    return g, scene_scale


def run_gsplat(train_set: Dataset, test_set: Dataset, steps: int, background, seed: int,
               opacity_reset: bool = False, points=None) -> dict:
    """gsplat's simple_trainer loop with its defaults (SIMPLE_TRAINER, DefaultStrategy as constructed there),
    on our data: shuffled epochs of one view a step, SH degree growing every 1000 steps, means' learning rate
    decaying to 1% over the run. With `opacity_reset` the loop also resets opacities at the strategy's
    reset steps, which gsplat 1.5.3's own test skips."""
    from gsplat import rasterization
    from gsplat.strategy import DefaultStrategy
    from gsplat.strategy.ops import reset_opa

    st = SIMPLE_TRAINER
    g, scene_scale = simple_trainer_init(train_set.cameras, seed, points)
    params = torch.nn.ParameterDict({
        "means": g.means, "scales": g.log_scales, "quats": g.quats, "opacities": g.opacity_logits,
        "sh0": g.sh_dc, "shN": g.sh_rest})
    lr = {"means": st["means_lr"] * scene_scale, "scales": st["scales_lr"], "quats": st["quats_lr"],
          "opacities": st["opacities_lr"], "sh0": st["sh0_lr"], "shN": st["shN_lr"]}
    optimizers = {k: torch.optim.Adam([{"params": params[k], "lr": lr[k], "name": k}], eps=1e-15)
                  for k in params}
    means_decay = torch.optim.lr_scheduler.ExponentialLR(
        optimizers["means"], gamma=st["means_lr_final_ratio"] ** (1.0 / steps))
    strategy = DefaultStrategy()
    strategy.check_sanity(params, optimizers)
    state = strategy.initialize_state(scene_scale=scene_scale)
    bg = torch.tensor([background], dtype=torch.float32, device="cuda")
    cams = [camera_tensors(c, "cuda") for c in train_set.cameras]
    generator = torch.Generator().manual_seed(seed)
    bar = Progress(steps, "gsplat simple_trainer")

    def render(view, K, width, height, sh_degree):
        colors = torch.cat([params["sh0"], params["shN"]], 1)
        img, _, info = rasterization(params["means"], params["quats"], torch.exp(params["scales"]),
                                     torch.sigmoid(params["opacities"]), colors, view[None], K[None], width, height,
                                     sh_degree=sh_degree, packed=False, backgrounds=bg)
        return img[0], info

    def loop():
        order: list[int] = []
        for step in range(steps):
            if not order:
                order = torch.randperm(len(train_set), generator=generator).tolist()
            i = order.pop()
            cam = train_set.cameras[i]
            img, info = render(*cams[i], cam.width, cam.height, min(step // st["sh_degree_interval"], st["sh_degree"]))
            strategy.step_pre_backward(params, optimizers, state, step, info)
            loss = photometric_loss(img, train_set.image(i), st["ssim_lambda"])  # float, as its users train
            loss.backward()
            for opt in optimizers.values():
                opt.step()
                opt.zero_grad(set_to_none=True)
            means_decay.step()
            strategy.step_post_backward(params, optimizers, state, step, info, packed=False)
            if opacity_reset and 0 < step < strategy.refine_stop_iter and step % strategy.reset_every == 0:
                reset_opa(params, optimizers, state, value=strategy.prune_opa * 2.0)
            bar.update(step + 1, gaussians=len(params["means"]))
    seconds, peak = measure(loop)
    bar.close()
    scores = score(lambda cam: render(*camera_tensors(cam, "cuda"), cam.width, cam.height, st["sh_degree"])[0],
                   test_set)
    return {"steps": steps, "seconds": seconds, **scores, "gaussians": len(params["means"]), "peak_bytes": peak}


def ours_runs(rows: dict, kind: str) -> list[dict]:
    """Our first run's row and those of the other runs of a kind ("seed", "repeat"), in order."""
    return [r for name, r in rows.items() if name == "splatwright" or name.startswith(f"splatwright, {kind} ")]


def report(rows: dict, cfg: TrainConfig, preset: str, scene: str, warm_ups: dict, sfm: bool = False) -> None:
    commit = git_commit()
    header = (f"{scene}, preset {preset} ({cfg.iterations} steps, seed {cfg.seed}), ours trained and scored in the "
              f"{cfg.image_formation} image formation, {torch.cuda.get_device_name()}, commit {commit}, "
              f"{datetime.now(timezone.utc):%Y-%m-%d}")
    lines = [header, "", "| trainer | steps | train s | PSNR | SSIM | worst view PSNR | Gaussians | peak GB |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['steps']} | {r['seconds']:.1f} | {r['psnr']:.2f} | {r['ssim']:.4f} | "
                     f"{r['worst_psnr']:.2f} (view {r['worst_view']}) | {r['gaussians']} | "
                     f"{r['peak_bytes'] / 1e9:.2f} |")
    lines.append("\nTrain s starts after each trainer's one-time warm-up in this process (its kernels loaded and run "
                 "once: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in warm_ups.items()) +
                 f"; ours is backend.train.warm_up, which the backend runs when it starts, the peer's "
                 f"{PEER_WARM_UP_STEPS} steps of its loop with its initialisation and a test-set score).")
    ours = rows["splatwright"]
    seeded = ours_runs(rows, "seed")
    if len(seeded) > 1:
        psnrs = [r["psnr"] for r in seeded]
        lines.append(f"\nours over {len(seeded)} seeds: PSNR min {min(psnrs):.2f}, mean {sum(psnrs) / len(psnrs):.2f}, "
                     f"max {max(psnrs):.2f} dB; time mean {sum(r['seconds'] for r in seeded) / len(seeded):.1f} s "
                     f"(the ratios below are the first seed's)")
    repeats = ours_runs(rows, "repeat")
    if len(repeats) > 1:
        times = sorted(r["seconds"] for r in repeats)
        same = all(r["psnr"] == ours["psnr"] and r["gaussians"] == ours["gaussians"] for r in repeats)
        lines.append(f"\nours over {len(repeats)} runs of seed {cfg.seed}: train s min {times[0]:.2f}, median "
                     f"{times[len(times) // 2]:.2f}, max {times[-1]:.2f}; "
                     + ("the same model each time" if same else "the models differ: the run did not repeat"))
    for name, r in rows.items():
        if name.startswith("gsplat"):
            lines.append(f"\nours/{name}: time {ours['seconds'] / r['seconds']:.2f}, "
                         f"PSNR {ours['psnr'] - r['psnr']:+.2f} dB, memory {ours['peak_bytes'] / r['peak_bytes']:.2f}")
            if name == next(n for n in rows if n.startswith("gsplat")):
                init = "init_type sfm (both trainers start on the scene's points)" if sfm else "init_type random"
                lines.append(f"Peer: {name}, {r['steps']} steps, simple_trainer's defaults, {init}; deviations: "
                             f"{'' if sfm else PEER_RANDOM_INIT}{PEER_DEVIATIONS}.")
        elif name.startswith("splatwright, resumed"):
            lines.append(f"\n{name} vs uninterrupted: PSNR {r['psnr'] - ours['psnr']:+.3f} dB")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    formation = "" if cfg.image_formation == STANDARD else f"-{cfg.image_formation}"
    stem = f"train-{scene}-{preset}{formation}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    (RESULTS / f"{stem}.md").write_text(text + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"header": header, "rows": rows, "warm_up_seconds": warm_ups},
                                                     indent=2))

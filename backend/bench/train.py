"""`python -m backend bench train`: train on a scene (lego unless told) with our trainer and, where gsplat is importable, with a
gsplat-based trainer following the same recipe, on the same data and initial Gaussians in the same run."""
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

import torch

from ..data import LEGO
from ..policy import PRESETS
from ..data import Dataset, camera_extent, load_split, scene_bounds
from ..gaussians import Gaussians
from ..metrics import photometric_loss
from ..progress import Progress
from ..render import camera_tensors
from ..train import Trainer, TrainConfig, evaluate, load_checkpoint, score
from . import RESULTS, git_commit



def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench train")
    p.add_argument("--data", default=str(LEGO))
    p.add_argument("--preset", default="quality", choices=sorted(PRESETS))
    p.add_argument("--iters", type=int, default=None, help="override the preset's step count")
    p.add_argument("--peer", default="shipped", choices=["shipped", "reset", "both", "none"],
                   help="the gsplat loop with its DefaultStrategy as shipped, with opacity resets made by the loop "
                        "(gsplat 1.5.3's strategy never resets: its test `step %% reset_every == 0 & step > 0` is "
                        "always false), both, or no peer")
    p.add_argument("--resume-check", action="store_true",
                   help="also train ours stopped halfway, checkpointed and resumed, and compare the two")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench train needs a CUDA GPU", file=sys.stderr)
        return 1
    cfg = replace(PRESETS[args.preset], rasterizer="cuda")
    if args.iters:
        cfg = replace(cfg, iterations=args.iters)
    train_set = load_split(args.data, "train", cfg.background).to("cuda")
    test_set = load_split(args.data, "test", cfg.background).to("cuda")
    center, half = scene_bounds(train_set.cameras)
    init = Gaussians.random_in_box(cfg.init_points, center, half, cfg.sh_degree, cfg.seed)

    rows = {"splatwright": run_ours(train_set, test_set, cfg, init)}
    if args.resume_check:
        rows[f"splatwright, resumed at {cfg.iterations // 2}"] = run_ours(train_set, test_set, cfg, init,
                                                                          resume_at=cfg.iterations // 2)
    variants = {"shipped": [False], "reset": [True], "both": [False, True], "none": []}[args.peer]
    if variants and importlib.util.find_spec("gsplat") is None:
        print("gsplat is not importable: peer skipped", file=sys.stderr)
        variants = []
    for opacity_reset in variants:
        import gsplat
        name = f"gsplat {gsplat.__version__}" + (" + opacity reset" if opacity_reset else "")
        rows[name] = run_gsplat(train_set, test_set, cfg, init, opacity_reset)
    report(rows, cfg, args.preset, Path(args.data).resolve().name)
    return 0


def _measure(fn) -> tuple[float, int]:
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
    bar = Progress(cfg.iterations, "splatwright")

    def loop(until: int):
        while trainer.step < until:
            trainer.train_step()
            bar.update(trainer.step, loss=trainer.last["loss"], gaussians=len(trainer.g))
    seconds, peak = _measure(lambda: loop(resume_at or cfg.iterations))
    if resume_at:
        with tempfile.TemporaryDirectory() as folder:
            trainer.save_checkpoint(Path(folder) / "checkpoint.pt")
            trainer = Trainer.from_checkpoint(train_set, load_checkpoint(Path(folder) / "checkpoint.pt"), "cuda", cfg)
        more_seconds, more_peak = _measure(lambda: loop(cfg.iterations))
        seconds, peak = seconds + more_seconds, max(peak, more_peak)
    bar.close()
    scores = evaluate(trainer.g, test_set, trainer.sh_degree, cfg.background, "cuda")
    return {"steps": trainer.step, "seconds": seconds, **scores, "gaussians": len(trainer.g), "peak_bytes": peak}


def run_gsplat(train_set: Dataset, test_set: Dataset, cfg: TrainConfig, init: Gaussians,
               opacity_reset: bool = False) -> dict:
    """A plain gsplat training loop: same loss, learning rates, SH schedule and densification settings.
    With `opacity_reset` the loop resets opacities at the strategy's reset steps, which its own test skips."""
    from gsplat import rasterization
    from gsplat.strategy import DefaultStrategy
    from gsplat.strategy.ops import reset_opa

    extent = camera_extent(train_set.cameras)
    g = init.to("cuda")
    params = torch.nn.ParameterDict({
        "means": g.means, "scales": g.log_scales, "quats": g.quats, "opacities": g.opacity_logits,
        "sh0": g.sh_dc, "shN": g.sh_rest})
    lr = {"means": cfg.lr.means * extent, "scales": cfg.lr.log_scales, "quats": cfg.lr.quats,
          "opacities": cfg.lr.opacity_logits, "sh0": cfg.lr.sh_dc, "shN": cfg.lr.sh_rest}
    optimizers = {k: torch.optim.Adam([{"params": params[k], "lr": lr[k], "name": k}], eps=1e-15, fused=True)
                  for k in params}
    means_decay = torch.optim.lr_scheduler.ExponentialLR(
        optimizers["means"], gamma=(cfg.lr.means_final / cfg.lr.means) ** (1.0 / cfg.iterations))
    d = cfg.densify
    strategy = DefaultStrategy(prune_opa=d.prune_opacity, grow_grad2d=d.grad_threshold, grow_scale3d=d.percent_dense,
                               prune_scale3d=d.prune_scale, refine_start_iter=d.start, refine_stop_iter=d.stop,
                               reset_every=d.reset_opacity_every, refine_every=d.every)
    strategy.check_sanity(params, optimizers)
    state = strategy.initialize_state(scene_scale=extent)
    background = torch.tensor([cfg.background], dtype=torch.float32, device="cuda")
    cams = [camera_tensors(c, "cuda") for c in train_set.cameras]
    generator = torch.Generator().manual_seed(cfg.seed)
    bar = Progress(cfg.iterations, "gsplat")

    def render(view, K, width, height, sh_degree):
        colors = torch.cat([params["sh0"], params["shN"]], 1)
        img, _, info = rasterization(params["means"], params["quats"], torch.exp(params["scales"]),
                                     torch.sigmoid(params["opacities"]), colors, view[None], K[None], width, height,
                                     sh_degree=sh_degree, packed=False, backgrounds=background)
        return img[0], info

    def loop():
        for step in range(cfg.iterations):
            i = int(torch.randint(len(train_set), (1,), generator=generator))
            cam = train_set.cameras[i]
            sh_degree = min(cfg.sh_degree, step // cfg.sh_interval)
            img, info = render(*cams[i], cam.width, cam.height, sh_degree)
            strategy.step_pre_backward(params, optimizers, state, step, info)
            loss = photometric_loss(img, train_set.images[i], cfg.ssim_weight)
            loss.backward()
            for opt in optimizers.values():
                opt.step()
                opt.zero_grad(set_to_none=True)
            means_decay.step()
            strategy.step_post_backward(params, optimizers, state, step, info, packed=False)
            if opacity_reset and d.reset_opacity_every and 0 < step < d.stop and step % d.reset_opacity_every == 0:
                reset_opa(params, optimizers, state, value=2 * d.prune_opacity)
            bar.update(step + 1, gaussians=len(params["means"]))
    seconds, peak = _measure(loop)
    bar.close()
    scores = score(lambda cam: render(*camera_tensors(cam, "cuda"), cam.width, cam.height, cfg.sh_degree)[0],
                   test_set)
    return {"steps": cfg.iterations, "seconds": seconds, **scores, "gaussians": len(params["means"]),
            "peak_bytes": peak}


def report(rows: dict, cfg: TrainConfig, preset: str, scene: str) -> None:
    commit = git_commit()
    header = (f"{scene}, preset {preset} ({cfg.iterations} steps), {torch.cuda.get_device_name()}, "
              f"commit {commit}, {datetime.now(timezone.utc):%Y-%m-%d}")
    lines = [header, "", "| trainer | steps | train s | PSNR | SSIM | Gaussians | peak GB |", "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['steps']} | {r['seconds']:.1f} | {r['psnr']:.2f} | {r['ssim']:.4f} | "
                     f"{r['gaussians']} | {r['peak_bytes'] / 1e9:.2f} |")
    ours = rows["splatwright"]
    for name, r in rows.items():
        if name.startswith("gsplat"):
            lines.append(f"\nours/{name}: time {ours['seconds'] / r['seconds']:.2f}, "
                         f"PSNR {ours['psnr'] - r['psnr']:+.2f} dB, memory {ours['peak_bytes'] / r['peak_bytes']:.2f}")
        elif name != "splatwright":
            lines.append(f"\n{name} vs uninterrupted: PSNR {r['psnr'] - ours['psnr']:+.3f} dB")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"train-{scene}-{preset}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    (RESULTS / f"{stem}.md").write_text(text + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"header": header, "rows": rows}, indent=2))

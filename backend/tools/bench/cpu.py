"""The CPU reference path's budget: lego at 100x100 with the CPU schedule (300 steps, at most 20k Gaussians)
must gain at least GAIN_DB of held-out PSNR within BUDGET_SECONDS on two cores.

    python -m backend bench cpu [--steps N] [--out DIR]

Writes cpu-<date>.json and .md into --out (default bench/results); exits 1 when a bar is missed.
"""
from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

import torch

from ...data import LEGO, load_split
from ...data.dataset import Dataset
from ...policy import cpu_config
from ...train import Trainer, evaluate
from ..progress import Progress
from . import RESULTS, git_commit, train_until, write_results

BUDGET_SECONDS = 300.0
GAIN_DB = 6.0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench cpu", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=LEGO)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    train = load_split(args.data, "train", downscale=4)
    test_all = load_split(args.data, "test", downscale=4)
    test = Dataset(test_all.cameras[::4], test_all.images[::4], test_all.names[::4])
    cfg = cpu_config(args.steps)
    trainer = Trainer(train, cfg)
    initial = evaluate(trainer.g, test, 0, cfg.background, "reference")["psnr"]
    load_before = os.getloadavg()[0]
    bar = Progress(cfg.iterations, "cpu training")
    start = time.monotonic()
    train_until(trainer, cfg.iterations, bar)
    seconds = time.monotonic() - start
    bar.close()
    final = evaluate(trainer.g, test, trainer.sh_degree, cfg.background, "reference")["psnr"]
    now = datetime.datetime.now(datetime.timezone.utc)
    width, height = train.cameras[0].width, train.cameras[0].height
    result = {"benchmark": "cpu", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
              "scene": args.data.resolve().name, "size": [width, height], "steps": cfg.iterations,
              "threads": torch.get_num_threads(), "seconds": seconds, "psnr_before": initial, "psnr_after": final,
              "gaussians": len(trainer.g), "load_average": [load_before, os.getloadavg()[0]],
              "budget_seconds": BUDGET_SECONDS, "gain_db": GAIN_DB}
    report = "\n".join([
        f"CPU reference path, {result['scene']} at {width}x{height}, {cfg.iterations} steps, "
        f"{result['threads']} threads, commit {result['commit']}, {result['date']} (1-minute load average "
        f"{load_before:.1f} before, {result['load_average'][1]:.1f} after)", "",
        "| train s | budget s | time / budget | PSNR before | PSNR after | gain dB (bar) | Gaussians |",
        "|---|---|---|---|---|---|---|",
        f"| {seconds:.0f} | {BUDGET_SECONDS:.0f} | {seconds / BUDGET_SECONDS:.2f} | {initial:.2f} | {final:.2f} | "
        f"{final - initial:+.2f} ({GAIN_DB:+.1f}) | {len(trainer.g)} |"])
    write_results(args.out, f"cpu-{now.strftime('%Y%m%d-%H%M')}", result, report)
    return 0 if seconds <= BUDGET_SECONDS and final - initial >= GAIN_DB else 1

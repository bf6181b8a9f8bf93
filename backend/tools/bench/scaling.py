"""`python -m backend bench train --gpus N`: the same training on one GPU and on N (data-parallel and partitioned),
each in fresh processes after the backend's warm-up: seconds, test PSNR, Gaussians, bytes sent a step, and the
scaling efficiency against one GPU (one GPU's seconds / (N x N GPUs' seconds); 1 is perfect)."""
from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from ...data import load_split
from ...distributed import Group, check_gpus, launch
from ...policy import PRESETS, cpu_config, device_name
from ...train import TrainConfig, Trainer, evaluate, warm_up, with_steps
from . import RESULTS, git_commit


def scaling(data: str, gpus: int, device: str, preset: str, iters: int | None, seed: int) -> dict:
    """Train on `data` in 1 and `gpus` processes (device 'auto', 'cuda' or 'cpu'); the rows by name, and the report
    written to bench/results/."""
    kind = check_gpus(gpus, device)
    cfg = (replace(PRESETS[preset], rasterizer="cuda") if kind == "cuda" else cpu_config(iters or 300))
    if iters:
        cfg = with_steps(cfg, iters)
    cfg = replace(cfg, seed=seed, batch_views=gpus)  # every run trains on the same batches
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for world, parallel in ((1, "data"), (gpus, "data"), (gpus, "partitioned")):
            out = Path(folder) / f"{world}-{parallel}.json"
            launch(_train, world, kind, data, asdict(replace(cfg, parallel=parallel)), str(out))
            unit = ("GPU" if kind == "cuda" else "process") if world == 1 else ("GPUs" if kind == "cuda" else "processes")
            name = f"{world} {unit}" + (f", {parallel}" if world > 1 else "")
            rows[name] = {"processes": world, **json.loads(out.read_text())}
    one = next(iter(rows.values()))
    for row in rows.values():
        row["efficiency"] = one["seconds"] / (row["processes"] * row["seconds"])
    header = (f"{Path(data).resolve().name}, {cfg.iterations} steps of {cfg.batch_views} views, seed {seed}, "
              f"{device_name(kind)}, commit {git_commit()}, {datetime.now(timezone.utc):%Y-%m-%d}")
    lines = [header, "", "| run | train s | efficiency | PSNR | Gaussians | MB sent a step |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['seconds']:.1f} | {r['efficiency']:.2f} | {r['psnr']:.2f} | {r['gaussians']} | "
                     f"{r['sent_per_step'] / 1e6:.2f} |")
    lines.append("\nTrain s: the leader's, after warm-up; efficiency: one process's seconds / (N x N processes' "
                 "seconds); MB sent a step: what the leader put into collectives, averaged over the run.")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"train-gpus-{gpus}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    (RESULTS / f"{stem}.md").write_text(text + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"header": header, "rows": rows}, indent=2))
    return rows


def _train(group: Group, device: str, data: str, cfg_dict: dict, out: str) -> None:
    """One process of a run: warm up, train, and the leader scores the whole model and writes the row."""
    if torch.device(device).type == "cuda":
        warm_up(device)
    cfg = TrainConfig.from_dict(cfg_dict)
    trainer = Trainer(load_split(data, "train", cfg.background).to(device), cfg, device, group=group)
    while trainer.step < trainer.cfg.iterations:
        trainer.train_step()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    sent_per_step = group.sent / trainer.step
    model = trainer.whole_model()
    if group.leader:
        test_set = load_split(data, "test", cfg.background) or load_split(data, "train", cfg.background)
        scores = evaluate(model, test_set.to(device), trainer.sh_degree, cfg.background, cfg.rasterizer,
                          cfg.image_formation)
        Path(out).write_text(json.dumps({"seconds": trainer.train_seconds, "psnr": scores["psnr"],
                                         "gaussians": len(model), "sent_per_step": sent_per_step}))

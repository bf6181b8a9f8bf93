"""Benchmarks: `python -m backend bench NAME [options]`; each is a module here with main(argv) -> int."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np

BENCHMARKS = ("raster", "train", "serve", "profile", "viewport", "defaults", "cpu", "overlay", "dynamic", "scrub",
              "memory", "formation", "native4d", "follow", "appearance", "video", "photos")
ROOT = Path(__file__).resolve().parents[3]  # the checkout
RESULTS = ROOT / "bench" / "results"


def model_extent(means, fraction: float) -> tuple[np.ndarray, float]:
    """A model's centre (its means' median) and the radius around it holding `fraction` of its means, leaving out
    the few far ones a trained model has."""
    means = means.detach().cpu().double().numpy()
    centre = np.median(means, axis=0)
    return centre, float(np.quantile(np.linalg.norm(means - centre, axis=1), fraction))


def train_until(trainer, step: int, bar) -> None:
    """Train to `step`, the progress bar showing the loss and the Gaussians."""
    while trainer.step < step:
        trainer.train_step()
        bar.update(trainer.step, loss=trainer.last["loss"], gaussians=len(trainer.g))


def git_commit() -> str:
    """$SPLATWRIGHT_COMMIT if set (machines with a copied tree but no usable git), else HEAD, with '+changes'
    if the kernels or backend differ from it."""
    if os.environ.get("SPLATWRIGHT_COMMIT"):
        return os.environ["SPLATWRIGHT_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "cuda", "backend"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        head = None
    if head is None or head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+changes" if status.stdout.strip() else "")


def write_results(out: Path, stem: str, result: dict, report: str) -> Path:
    """Print a benchmark's report and keep it with its figures as out/stem.md and out/stem.json (stem-2, -3, ...
    where a run in the same minute kept its results under that name)."""
    print(report)
    out.mkdir(parents=True, exist_ok=True)
    path, copy = out / stem, 1
    while path.with_suffix(".json").exists() or path.with_suffix(".md").exists():
        copy += 1
        path = out / f"{stem}-{copy}"
    path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    path.with_suffix(".md").write_text(report + "\n")
    print(f"wrote {path}.json and .md")
    return path


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m backend bench {{{','.join(BENCHMARKS)}}} [options]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")
        return 2
    return importlib.import_module(f"{__name__}.{name}").main(rest)

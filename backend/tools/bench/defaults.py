"""The panel's defaults, end to end: in real Blender (the bpy module, blender_defaults.py in its own process) the
add-on connects to a local backend, the scene takes that device's defaults, and a capture and its training run
with them, timed; on Blender's startup scene and on the demo's scene. On a CPU both should finish within
BUDGET_SECONDS.

    python -m backend bench defaults [--scenes startup,demo] [--out DIR]

Writes defaults-<date>-<device>.json and .md into --out (default bench/results).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import build_addon
from . import RESULTS, git_commit, write_results

SCENARIO = Path(__file__).resolve().parent / "blender_defaults.py"
BUDGET_SECONDS = 300.0  # capture and training of each scene with the CPU defaults, on two cores


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench defaults", description=__doc__.split("\n")[0])
    p.add_argument("--scenes", default="startup,demo")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="splatwright-bench-") as home:
        home = Path(home)
        addon_zip = build_addon.build(home / "dist")
        env = {"BLENDER_USER_SCRIPTS": str(home / "scripts"), "BLENDER_USER_CONFIG": str(home / "config"),
               "BLENDER_USER_EXTENSIONS": str(home / "extensions")}
        run = subprocess.run([sys.executable, str(SCENARIO), "--zip", str(addon_zip), "--out", str(home / "out"),
                              "--scenes", args.scenes], capture_output=True, text=True, cwd=home,
                             env={**os.environ, **env}, timeout=3600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
        return 1
    result = json.loads(lines[-1][len("RESULT "):])
    now = datetime.datetime.now(datetime.timezone.utc)
    result.update(benchmark="defaults", date=now.strftime("%Y-%m-%d %H:%M UTC"), commit=git_commit(),
                  budget_seconds=BUDGET_SECONDS, load_average=[load_before, os.getloadavg()[0]])
    scenes = args.scenes.split(",")
    rows = [f"| {name} | {r['size'][0]}x{r['size'][1]} | {r['views']} | {r['steps']} | {r['capture_seconds']:.0f} | "
            f"{r['train_seconds']:.0f} | {r['total_seconds']:.0f} | {r['steps'] / r['train_seconds']:.2f} | {r['psnr'] or 0:.2f} | "
            f"{r['eta_at_a_tenth']['shown']:.0f} / {r['eta_at_a_tenth']['actual']:.0f} "
            f"({100 * r['eta_at_a_tenth']['error']:.0f}%) |"
            for name in scenes for r in [result[name]]]
    report = "\n".join([
        f"Panel defaults on the {result['device']} backend, Blender {result['blender']}, commit {result['commit']}, "
        f"{result['date']} (backend start {result['backend_start_seconds']:.0f} s; 1-minute load average "
        f"{result['load_average'][0]:.1f} before, {result['load_average'][1]:.1f} after)", "",
        "| scene | view size | views sent | steps | capture s | train s | total s | it/s | train PSNR | time left at 10% |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        f"Budget: {BUDGET_SECONDS:.0f} s per scene for capture and training. Time left at 10%: what the panel showed "
        "once a tenth of the steps were done / the seconds training took from there (the error)."])
    write_results(args.out, f"defaults-{now.strftime('%Y%m%d-%H%M')}-{result['device']}", result, report)
    within = all(result[name]["total_seconds"] <= BUDGET_SECONDS for name in scenes)
    return 0 if within or result["device"] != "cpu" else 1

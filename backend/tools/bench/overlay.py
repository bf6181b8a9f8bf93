"""Viewport composite benchmark: the main thread's cost of showing a placed splat model with the scene in a 3D
viewport, in a real Blender window at 1920x1080: Debian's Blender 3.4 under Xvfb (Mesa's software GL where there
is no GPU) with a CPU backend holding a small model. Reports p50/p95/max of the add-on's draw handler
(overlay.draw) over redraws that show the frame they had and over redraws that show a new full-size frame, of
the timer ticks that upload a new frame's strips between redraws, and how long a new frame takes from its first
strip to being shown; the bar, BAR_MS, holds for each redraw and each tick.

    python -m backend bench overlay [--gaussians 500] [--redraws 200] [--uploads 8] [--out DIR]

Blender runs overlay_window.py, the window's side. Writes overlay-<date>-<host>.json and .md into --out (default
bench/results).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import build_addon
from ...gaussians import Gaussians
from ...service.session import Session
from ...train import TrainConfig, Trainer
from . import RESULTS, ROOT, git_commit, write_results
from .serve import make_scene

WINDOW = (1920, 1080)
WINDOW_SCRIPT = Path(__file__).resolve().parent / "overlay_window.py"
BAR_MS = 5.0  # the product's bar for the main thread per redraw
SESSION = "bench-overlay"
BACKGROUND = (0.3, 0.5, 0.7)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench overlay", description=__doc__.split("\n")[0])
    p.add_argument("--gaussians", type=int, default=500)
    p.add_argument("--redraws", type=int, default=200, help="redraws that show the frame they had")
    p.add_argument("--uploads", type=int, default=8, help="redraws that upload a new full-size frame")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if not (shutil.which("blender") and shutil.which("Xvfb")):
        print("needs Debian's blender and Xvfb (apt-get install blender xvfb python3-numpy)")
        return 2
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="splatwright-bench-") as home:
        home = Path(home)
        trained_session(home / "sessions", args.gaussians)
        addon_zip = build_addon.build(home / "dist")
        env = {**os.environ, "BLENDER_USER_SCRIPTS": str(home / "scripts"), "BLENDER_USER_CONFIG": str(home / "config")}
        with xvfb() as display:
            run = subprocess.run(["blender", "--factory-startup", "-p", "0", "0", str(WINDOW[0]), str(WINDOW[1]),
                                  "--python", str(WINDOW_SCRIPT), "--", "--zip", str(addon_zip),
                                  "--workdir", str(home / "sessions"), "--session", SESSION, "--python", sys.executable,
                                  "--redraws", str(args.redraws), "--uploads", str(args.uploads),
                                  "--out", str(home / "out")],
                                 env={**env, "DISPLAY": display}, cwd=ROOT, capture_output=True, text=True,
                                 timeout=1800)
        result_file = home / "out" / "result.json"
        if not result_file.is_file():
            print(f"Blender wrote no result (exit code {run.returncode}):", run.stdout[-3000:], run.stderr[-3000:],
                  sep="\n")
            return 1
        result = json.loads(result_file.read_text())
    if "failure" in result:
        print(result["traceback"])
        return 1
    now = datetime.datetime.now(datetime.timezone.utc)
    result.update(benchmark="overlay", date=now.strftime("%Y-%m-%d %H:%M UTC"), commit=git_commit(),
                  gaussians=args.gaussians, bar_ms=BAR_MS, host=platform.node(), cpus=os.cpu_count(),
                  load_average=[load_before, os.getloadavg()[0]])
    rows = [f"| {label} | {result[key]['count']} | {result[key]['p50_ms']:.2f} | {result[key]['p95_ms']:.2f} | "
            f"{result[key]['max_ms']:.2f} |" for label, key in (
                ("redraw, frame already on the GPU", "draw_steady"),
                ("redraw that shows a new full-size frame", "draw_new_frame"),
                ("timer tick uploading strips of a full-size frame (between redraws)", "upload_tick"))]
    worst = max(result[key]["p95_ms"] for key in ("draw_steady", "draw_new_frame", "upload_tick"))
    report = "\n".join([
        f"Viewport composite, main thread per redraw and upload tick: {result['region'][0]}x{result['region'][1]} "
        f"region of a {WINDOW[0]}x{WINDOW[1]} window, Blender {result['blender']} ({result['gpu']}), {args.gaussians} "
        f"Gaussians on a CPU backend; commit {result['commit']}, {result['date']}, {result['cpus']} CPUs (1-minute "
        f"load average {result['load_average'][0]:.1f} before, {result['load_average'][1]:.1f} after)", "",
        "| what | count | p50 ms | p95 ms | max ms |", "|---|---|---|---|---|", *rows, "",
        f"A new full-size frame is shown {result['frame_shown']['p50_ms']:.0f} ms (p50; p95 "
        f"{result['frame_shown']['p95_ms']:.0f} ms) after its first strip went up, over "
        f"{result['upload_ticks_per_frame']:.1f} timer ticks ({result['frame_shown']['count']} frames).", "",
        f"Bar: {BAR_MS:.0f} ms of the main thread per redraw or tick; p95 {'within' if worst < BAR_MS else 'over'} it "
        f"({worst:.2f} ms)."])
    write_results(args.out, f"overlay-{now.strftime('%Y%m%d-%H%M')}-{platform.node()}", result, report)
    return 0


def trained_session(workdir: Path, gaussians: int) -> None:
    """Session SESSION in `workdir` with a checkpoint of a random model in the unit cube (serve.make_scene's)."""
    xyz, rgb, cameras, images = make_scene(gaussians, 2, 32, 24, "cpu", "reference")
    workdir.mkdir(parents=True, exist_ok=True)
    session = Session.open(workdir, SESSION, create=True)
    for i, (cam, image) in enumerate(zip(cameras, images)):
        session.add_view(cam, image[::-1].copy(), f"view_{i}")  # make_scene's rows are bottom-up
    model = Gaussians.from_point_cloud(xyz, rgb, 0, "cpu")
    trainer = Trainer(session.dataset(BACKGROUND), TrainConfig(iterations=1, sh_degree=0, background=BACKGROUND),
                      "cpu", model)
    trainer.save_checkpoint(session.checkpoint_path)


@contextlib.contextmanager
def xvfb():
    """An X server on a free display, named as ':N'."""
    read, write = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", f"{WINDOW[0]}x{WINDOW[1]}x24",
                             "-nolisten", "tcp"], pass_fds=(write,), stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as pipe:
        display = pipe.readline().strip()  # Xvfb names the display here once it listens
    try:
        if not display:
            raise RuntimeError("Xvfb did not start")
        yield f":{display}"
    finally:
        proc.terminate()
        proc.wait(10)

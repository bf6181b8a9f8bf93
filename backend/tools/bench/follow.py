"""What following a session's model costs Blender's main thread (5.3 and later: a native splat object): the
following timer (blender_addon/scene/following.py) refreshes an object from the backend's model, one step per
tick; every main-thread tick of the refresh is timed in a bpy 5.3 process (blender_follow.py), the backend a
stand-in whose model is a random one of --gaussians Gaussians (SH degree 3) at three training steps: into an
empty object (a resize from 0), the same count again, and 5% more (densified: a resize). Reports max, p95 and
p50 of the ticks against a 50 ms budget, the resize ticks and the depsgraph evaluation after a tick (a redraw's).

    python -m backend bench follow [--gaussians 1000000] [--python BPY53_PYTHON] [--out DIR]

Writes follow-<date>.json and .md into --out (default bench/results).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ...formats.ply import encode_ply
from . import RESULTS, ROOT, git_commit, write_results
from .native4d import random_model

SCENARIO = Path(__file__).resolve().parent / "blender_follow.py"
BUDGET_MS = 50.0


def stats(ms: list[float]) -> dict:
    a = np.array(ms)
    return {"count": len(a), "max_ms": float(a.max()), "p95_ms": float(np.percentile(a, 95)),
            "p50_ms": float(np.median(a))}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench follow", description=__doc__.split("\n")[0])
    p.add_argument("--gaussians", type=int, default=1_000_000)
    p.add_argument("--python", default=os.environ.get("SPLATWRIGHT_BPY53", str(ROOT / ".venv-bpy53" / "bin" / "python")))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    counts = (args.gaussians, args.gaussians, args.gaussians + args.gaussians // 20)
    with tempfile.TemporaryDirectory(prefix="splatwright-follow-") as work:
        paths = []
        for seed, count in enumerate(counts):
            path = Path(work) / f"step{seed + 1}.ply"
            path.write_bytes(encode_ply(random_model(count, seed).at(0.0).detached()))
            paths.append(str(path))
        run = subprocess.run([args.python, str(SCENARIO), *paths], capture_output=True, text=True, timeout=1800,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if run.returncode or not lines:
        raise SystemExit(f"{args.python} {SCENARIO.name} failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    info = json.loads(lines[-1][len("RESULT "):])
    ticks = info["ticks"]
    summary = {"all ticks": stats([t["ms"] for t in ticks]),
               "attribute writes": stats([t["ms"] for t in ticks if t["tick"].startswith("write ")]),
               "resizes": stats([t["ms"] for t in ticks if t["tick"].startswith("resize")]),
               "finishing (a new cloud swapped in, the step noted)": stats(
                   [t["ms"] for t in ticks if t["tick"] == "finish"]),
               "drains (the fetched model handed over)": stats([t["ms"] for t in ticks if t["tick"] == "drain"]),
               "evaluation after a tick": stats([t["evaluation_ms"] for t in ticks if "evaluation_ms" in t])}
    now = datetime.datetime.now(datetime.timezone.utc)
    result = {"benchmark": "follow", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
              "gaussians": args.gaussians, "counts": counts, "budget_ms": BUDGET_MS, "cpus": os.cpu_count(),
              "summary": summary, **info}
    longest = max(ticks, key=lambda t: t["ms"])
    verdict = "within" if summary["all ticks"]["max_ms"] <= BUDGET_MS else "over"
    resizes = [f"{t['tick']}: {t['ms']:.1f} ms" for t in ticks if t["tick"].startswith("resize")]
    seconds = ", ".join(f"{r['seconds']:.2f}" for r in info["refreshes"])
    report = "\n".join([
        f"Following a session's model: a native splat object refreshed {len(counts)} times from a stand-in "
        f"backend's model of {', '.join(map(str, counts))} Gaussians (SH degree 3), Blender {info['blender']} (bpy "
        f"module, CPU, {os.cpu_count()} cores); commit {result['commit']}, {result['date']}", "",
        "| main-thread ticks | count | max ms | p95 ms | p50 ms |", "|---|---|---|---|---|",
        *[f"| {what} | {s['count']} | {s['max_ms']:.1f} | {s['p95_ms']:.1f} | {s['p50_ms']:.1f} |"
          for what, s in summary.items()], "",
        f"The resize ticks: {'; '.join(resizes)}. The longest tick: {longest['tick']} (step {longest['step']}), "
        f"{longest['ms']:.1f} ms: {verdict} the {BUDGET_MS:.0f} ms budget. A refresh took "
        f"{seconds} s from its first tick to its last (the "
        "worker's PLY parsing included). The evaluation is the depsgraph's after each tick, as a redraw makes it "
        "(not part of the tick)."])
    write_results(args.out, f"follow-{now.strftime('%Y%m%d-%H%M')}", result, report)
    return 0

"""Structure from motion on a COLMAP capture's photos without its model: `photos` on its images/ folder with the
command's defaults, the cameras it finds against the capture's own model after a similarity alignment of the
camera centres, and the time each stage took. Bars: at least MIN_REGISTERED_SHARE of the photos registered, median
rotation error at most MAX_ROTATION_DEG, every camera centre within MAX_CENTRE_ERROR of the extent of the model's
camera centres, the focal length within MAX_FOCAL_ERROR of the model's; the aim: under AIM_SECONDS in all.

    python -m backend bench photos --data tests/data/colmap_skull [--out DIR] [--keep DIR]

--keep reconstructs into a new or empty folder and keeps it (a folder holding a database of the same photos would
skip features and matching).

Writes photos-<scene>-<date>.json and .md into --out (default bench/results); exits 1 when a bar is missed.
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ...data import colmap
from ...data.photos import DISTORTED, pycolmap_module, reconstruct, similarity
from ...service.limits import Limits
from ..progress import StageProgress
from . import RESULTS, git_commit, write_results

MIN_REGISTERED_SHARE = 60 / 65  # the skull's bar: 60 of its 65 photos
MAX_ROTATION_DEG = 1.0
MAX_CENTRE_ERROR = 0.02
MAX_FOCAL_ERROR = 0.05
AIM_SECONDS = 300.0


def agreement(found: Path, reference: Path) -> dict:
    """How the cameras of the capture `found` agree with those of `reference` (both COLMAP captures) after the
    similarity that takes the found camera centres closest to the reference's: the photos in both, the rotation
    errors in degrees, the centre errors as fractions of the extent (the diagonal of the box) of the reference's
    camera centres, and the relative error of the found focal length (the mean over the cameras of each)."""
    ours, theirs = camera_poses(found), camera_poses(reference)
    common = sorted(ours.keys() & theirs.keys())
    source = np.array([ours[n][0] for n in common])
    target = np.array([theirs[n][0] for n in common])
    scale, rotation, shift = similarity(source, target)
    centres = np.array([position for position, _ in theirs.values()])
    extent = np.linalg.norm(centres.max(axis=0) - centres.min(axis=0))
    centre_errors = np.linalg.norm(scale * source @ rotation.T + shift - target, axis=1) / extent
    angles = np.degrees(np.arccos(np.clip([(np.trace((rotation @ ours[n][1]).T @ theirs[n][1]) - 1) / 2
                                           for n in common], -1.0, 1.0)))
    pycolmap = pycolmap_module()
    focal, reference_focal = (np.mean([c.mean_focal_length() for c in pycolmap.Reconstruction(str(model))
                                       .cameras.values()])
                              for model in (found / DISTORTED / "sparse" / "0", colmap.find_model(reference)))
    return {"common": len(common), "rotation_deg_median": float(np.median(angles)),
            "rotation_deg_max": float(angles.max()), "centre_error_median": float(np.median(centre_errors)),
            "centre_error_max": float(centre_errors.max()), "focal_error": float(focal / reference_focal - 1)}


def camera_poses(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each photo's camera centre and rotation (camera to world) in a COLMAP capture."""
    cameras, names = colmap.load_cameras(root)
    return {name: (cam.position, cam.c2w[:3, :3]) for cam, name in zip(cameras, names)}


def bars(photos: int, registered: int, agreed: dict) -> dict[str, bool]:
    return {"registered": registered >= MIN_REGISTERED_SHARE * photos,
            "rotation": agreed["rotation_deg_median"] <= MAX_ROTATION_DEG,
            "centres": agreed["centre_error_max"] <= MAX_CENTRE_ERROR,
            "focal": abs(agreed["focal_error"]) <= MAX_FOCAL_ERROR}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench photos", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True,
                   help="a COLMAP capture (the skull's 65 photos: tests/data/colmap_skull in a checkout)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--keep", type=Path, help="reconstruct into this folder and keep it")
    args = p.parse_args(argv)
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        p.error(f"--keep {args.keep} holds files: name a new or empty folder (a database of the same photos would "
                "skip features and matching, and the times with them)")
    work = args.keep or Path(tempfile.mkdtemp(prefix="splatwright-bench-photos-"))
    try:
        return run(args, work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path) -> int:
    load_before, cpu_before = os.getloadavg()[0], os.times()
    progress = StageProgress()
    started = time.monotonic()
    try:
        result = reconstruct(args.data / "images", work, Limits().check, progress)
    finally:
        progress.close()
    seconds = time.monotonic() - started
    cpu_after = os.times()
    cpu = sum(cpu_after[i] - cpu_before[i] for i in range(4))  # this process's and its children's
    agreed = agreement(result.folder, args.data)
    passed = bars(result.photos, result.registered, agreed)
    now = datetime.datetime.now(datetime.timezone.utc)
    scene = args.data.resolve().name
    out = {"benchmark": "photos", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
           "scene": scene, "cores": os.cpu_count(),
           "load_average": [load_before, os.getloadavg()[0]], "photos": result.photos,
           "registered": result.registered, "points": result.points, "stages": result.seconds, "seconds": seconds,
           "cpu_seconds": cpu, "agreement": agreed, "bars": passed, "aim_met": seconds <= AIM_SECONDS}
    a = agreed
    report = "\n".join([
        f"Structure from motion on {scene}'s photos (`python -m backend photos`, its defaults), commit "
        f"{out['commit']}, {out['date']}, {out['cores']} cores (1-minute load average {load_before:.1f} before, "
        f"{out['load_average'][1]:.1f} after)", "",
        f"Registered {result.registered} of {result.photos} photos, {result.points} points, in {seconds:.0f} s "
        f"(aim: under {AIM_SECONDS:.0f} s; {cpu:.0f} s of CPU time). Stages (s): "
        + ", ".join(f"{stage} {s:.1f}" for stage, s in result.seconds.items()) + ".", "",
        f"Against the capture's own model ({a['common']} photos in both): rotation error median "
        f"{a['rotation_deg_median']:.3f} degrees (max {a['rotation_deg_max']:.3f}); camera centres median "
        f"{a['centre_error_median']:.3%} and max {a['centre_error_max']:.3%} of the extent; focal length "
        f"{a['focal_error']:+.2%}.", "",
        f"Bars: registered at least {MIN_REGISTERED_SHARE:.1%}: {passed['registered']}; median rotation at most "
        f"{MAX_ROTATION_DEG} degrees: {passed['rotation']}; centres within {MAX_CENTRE_ERROR:.0%}: "
        f"{passed['centres']}; focal length within {MAX_FOCAL_ERROR:.0%}: {passed['focal']}."])
    write_results(args.out, f"photos-{scene}-{now.strftime('%Y%m%d-%H%M')}", out, report)
    return 0 if all(passed.values()) else 1

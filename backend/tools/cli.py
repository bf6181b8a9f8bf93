"""Command line: python -m backend {train,photos,render,convert,info,demo,serve,bench} ..."""
from __future__ import annotations

import argparse

from blender_addon.core.codecs import MAX_IMAGE_SIDE
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.schema import Float, Str
from blender_addon.core.settings import TRAINING
from ..data.images import parse_background
from ..data.photos import EXHAUSTIVE_UP_TO
from ..data.video import DEFAULT_RATE, MAX_RATE, MIN_RATE
from ..formats import spz
from ..service import server
from ..service.arguments import Parser, add_group_arguments, add_serve_arguments, positive_int, run
from ..service.limits import Limits
from . import bench, commands, convert, demo
from .bench import BENCHMARKS


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m backend", description="Splatwright backend")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train Gaussians on a transforms*.json scene")
    p.add_argument("data", help="scene folder with transforms_train.json (and transforms_test.json), or a COLMAP "
                   "capture folder (sparse/0/ and images/)")
    p.add_argument("--out", required=True, help="output folder for splats.ply, metrics.json, checkpoint.pt")
    add_training_arguments(p)
    p.add_argument("--random-init", action="store_true",
                   help="start from random Gaussians even where the scene has a points3d.ply")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--init", default=None, metavar="FILE",
                   help="start from the Gaussians of a splat file (.ply, .compressed.ply, .spz, .splat, .ksplat, "
                        ".sog, a SOG folder's meta.json, .glb or .gltf)")
    add_spz_axes_argument(p)
    p.add_argument("--dynamic", action="store_true",
                   help="train a 4D model of moving Gaussians (OUT/splats4d.pt) even when the frames have no "
                   "'time'; frames with times always train one")
    add_group_arguments(p, "train on N GPUs of this host, one process each (with --device cpu: N processes on the "
                        "CPU); across hosts, start the command with torchrun instead (backend/README.md)")
    p.add_argument("--views-per-step", type=positive_int, default=None, metavar="N",
                   help="views each step trains on, shared out among the processes (default: one a process); a "
                   "resumed run keeps its checkpoint's")

    p = sub.add_parser("photos", help="structure from motion: a folder of photos, or a video, to a COLMAP dataset to "
                       "train on")
    p.add_argument("photos", help=f"folder of photos (.jpg, .png, .tif) of one scene, or a video (.mp4, .mov, .mkv, "
                   f"...); up to {EXHAUSTIVE_UP_TO} photos or frames are matched every one with every other, more of "
                   "them each with its neighbours in name (time) order")
    p.add_argument("--out", required=True,
                   help="output folder: the dataset (images/, sparse/), and the COLMAP database that a second run "
                   "reuses")
    p.add_argument("--max-image-size", type=positive_int, default=MAX_IMAGE_SIDE, metavar="N",
                   help=f"longest side, in pixels, at which features are found (default: {MAX_IMAGE_SIDE}); smaller "
                   "is faster")
    p.add_argument("--rate", type=frame_rate, default=DEFAULT_RATE, metavar="FPS",
                   help=f"for a video, frames taken a second of it (default: {DEFAULT_RATE:g}); of each run of "
                   "near-duplicates (the camera paused) only the sharpest stays")
    for name in ("views", "view_pixels", "video_seconds"):
        p.add_argument(Limits.flag(name), type=positive_int, default=getattr(Limits(), name), metavar="N",
                       help=f"most {Limits.meaning(name)}, as the server allows (default: {getattr(Limits(), name):,})")

    p = sub.add_parser("render", help="render a splat file through the cameras of a transforms file")
    p.add_argument("splats", help="splat file: 3DGS PLY, compressed PLY, SPZ, .splat, .ksplat, SOG or glTF; or a 4D "
                   "model (splats4d.pt)")
    add_spz_axes_argument(p)
    p.add_argument("--time", type=unit_interval, default=None,
                   help="time in [0, 1] over the captured frames at which to render a 4D model (default: 0)")
    p.add_argument("--cameras", required=True, help="transforms*.json (or a COLMAP capture folder) with the cameras")
    p.add_argument("--out", required=True, help="output folder for the PNGs")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    background = TRAINING.fields["background"]
    p.add_argument("--background", default=background.default, type=setting_parser("background", background.kind),
                   help=f"{background.help} (default: {background.default})")
    p.add_argument("--downscale", type=float, default=1.0)

    p = sub.add_parser("convert", help="convert a splat file to the format OUT's name gives")
    p.add_argument("input", help="splat file: 3DGS PLY, PlayCanvas compressed PLY, SPZ, .splat, .ksplat, SOG (a .sog "
                   "or a folder's meta.json) or glTF (.glb, .gltf), found by content; or a 4D model (splats4d.pt)")
    p.add_argument("output", help="file to write: *.ply (3DGS), *.compressed.ply, *.spz, *.splat, *.sog, "
                   "meta.json (a SOG folder), *.glb or *.gltf")
    p.add_argument("--sh-degree", type=int, choices=range(4), default=None, help="drop SH bands above this degree")
    add_spz_axes_argument(p)
    p.add_argument("--spz-version", type=int, choices=spz.VERSIONS, default=spz.VERSIONS[0],
                   help="the SPZ version written (default: %(default)s, zstd; 3, gzip, for readers older than 2026)")
    p.add_argument("--frames", type=positive_int, default=None,
                   help="a 4D model as N files, one per frame at evenly spaced times (OUT name_0001.ply ...)")

    sub.add_parser("info", help="report Python, torch, CUDA, the GPU and whether the CUDA rasterizer builds")

    p = sub.add_parser("demo", help="the Blender add-on end to end (capture, train, novel views, report); "
                       "training on a scene folder when one is given or bpy 4.5 is missing")
    p.add_argument("data", nargs="?", default=None,
                   help="scene folder to train on instead (default: the Blender demo, or the lego scene without bpy)")
    p.add_argument("--out", default=None, help="output folder (default: out/demo-<time>)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])

    add_serve_arguments(sub.add_parser("serve", help="serve training and rendering to the Blender add-on over TCP"))

    p = sub.add_parser("bench", help=f"benchmarks ({', '.join(BENCHMARKS)})", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command's own parser, not the top level's
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)} (--help lists the options)")
    command = {"train": commands.train, "photos": commands.photos, "render": commands.render_views, "info": commands.info, "demo": demo.demo,
               "convert": convert.convert, "serve": server.serve, "bench": lambda args: bench.main(args.rest)}
    return run(command[args.command], args)


def add_spz_axes_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spz-axes", choices=tuple(spz.AXES), default=tuple(spz.AXES)[0],
                   help="the axes of an SPZ that does not say its own: ply (as SuperSplat and splat-transform store "
                   "them; the default) or rub (as the SPZ specification says, Niantic's tools and Splatwright's "
                   "version 3)")


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """--device, --downscale and every training setting of the one table (settings.TRAINING) but the progress
    interval (the CLI draws a progress bar), with its default, range and help; --iters is --iterations."""
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--downscale", type=float, default=1.0, help="divide image sizes by this factor")
    for name, field in TRAINING.fields.items():
        if name == "progress_interval":
            continue
        flags = ["--" + name.replace("_", "-")] + (["--iters"] if name == "iterations" else [])
        if isinstance(field.kind, Str):
            p.add_argument(*flags, dest=name, default=field.default, choices=field.kind.choices, help=field.help)
        else:
            p.add_argument(*flags, dest=name, default=field.default, type=setting_parser(name, field.kind),
                           help=f"{field.help} (default: {field.default})" if field.default is not None else field.help)


def frame_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not MIN_RATE <= value <= MAX_RATE:
        raise argparse.ArgumentTypeError(f"{value} is not a rate from {MIN_RATE:g} to {MAX_RATE:g} frames a second")
    return value


def unit_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1]")
    return value


def setting_parser(name: str, kind):
    """The argparse type of a setting: the text parsed, then checked against the setting's range."""
    def parse(text: str):
        try:
            value = parse_background(text) if name == "background" else float(text) if isinstance(
                kind, Float) else int(text)
            return kind.check(list(value) if name == "background" else value)
        except (ValueError, SplatwrightError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = name  # argparse names the setting in its message
    return parse

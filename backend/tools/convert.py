"""`python -m backend convert IN OUT [--sh-degree N] [--spz-axes A] [--spz-version V] [--frames N]`: a splat file in
any supported format to the format OUT's name gives (*.ply, *.compressed.ply, *.spz, *.splat, *.sog, a folder's
meta.json, *.glb, *.gltf); an SPZ to an SPZ keeps its extension records and antialiasing flag (version 4); a 4D
model (splats4d.pt) to a sequence of files, one per frame (OUT name_0001.ply ...), as PLY-sequence players read them,
with a manifest (name.sequence.json) that says whether they are all there. The model's image formation goes with it
where the format has a place for it, and a note says what changes for other viewers."""
from __future__ import annotations

import sys
from pathlib import Path

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import begin_sequence, end_sequence, sequence_manifest, sequence_paths
from ..dynamic import DynamicGaussians
from ..formats import format_for_path, spz, with_sh_degree, write_any
from .commands import model_formation, read_model
from .progress import Progress


def convert(args) -> int:
    fmt = format_for_path(args.output)  # an unknown output name fails before the input is read
    g = read_model(args.input, args.spz_axes)
    formation = model_formation(args.input)
    if args.sh_degree is not None and args.sh_degree < g.max_sh_degree:
        g = with_sh_degree(g, args.sh_degree)
    elif args.sh_degree is not None and args.sh_degree > g.max_sh_degree:
        print(f"warning: --sh-degree {args.sh_degree}: SH degree {args.sh_degree} cannot be had, {args.input} holds "
              f"SH up to degree {g.max_sh_degree} only, so {args.output} does too", file=sys.stderr)
    kept = spz_extras(args.input) if fmt == "spz" else spz.Extras()
    options = dict(spz_version=args.spz_version, spz_kept=kept)
    if args.frames is None:
        if isinstance(g, DynamicGaussians):
            print(f"note: {args.input} is a 4D model; {args.output} holds its first frame (--frames N writes N)",
                  file=sys.stderr)
        write(g.at(0.0), Path(args.output), formation, **options)
        return 0
    if not isinstance(g, DynamicGaussians):
        raise SplatwrightError(f"--frames: {args.input} is a static model, the same at every time; give a 4D model "
                               "(splats4d.pt from training on views with times)")
    output = Path(args.output)
    paths = sequence_paths(output, args.frames)
    output.parent.mkdir(parents=True, exist_ok=True)
    begin_sequence(output, paths)  # until end_sequence, the manifest says the sequence is incomplete
    bar = Progress(len(paths), "convert")
    for k, path in enumerate(paths):
        write(g.at(k / (len(paths) - 1) if len(paths) > 1 else 0.0), path, formation, quiet=True, **options)
        bar.update(k + 1)
    bar.close()
    end_sequence(output, paths)
    print(f"wrote {len(paths)} frames of {len(g)} Gaussians: {paths[0]} ... {paths[-1]}, and "
          f"{sequence_manifest(output).name}, which lists them")
    return 0


def spz_extras(path: str) -> spz.Extras:
    """What an SPZ input holds beside its model (spz.extras), for an SPZ output to keep; nothing for another."""
    with open(path, "rb") as f:
        if not spz.is_spz(f.read(4)):
            return spz.Extras()
    return spz.extras(Path(path).read_bytes(), path)


def write(g, path: Path, formation: str, quiet: bool = False, **spz_options) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for note in write_any(path, g, formation, **spz_options):
        print(f"note: {note}", file=sys.stderr)
    if not quiet:
        print(f"wrote {len(g)} Gaussians (SH degree {g.max_sh_degree}) to {path} ({format_for_path(path)}, "
              f"{path.stat().st_size / 1e6:.2f} MB)")

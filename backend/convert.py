"""`python -m backend convert IN OUT [--sh-degree N]`: a splat file in any supported format to the format OUT's
name gives (*.ply, *.compressed.ply, *.spz, *.splat)."""
from __future__ import annotations

import sys
from pathlib import Path

from .formats import format_for_path, read_any, with_sh_degree, write_any


def convert(args) -> int:
    format_for_path(args.output)  # an unknown output name fails before the input is read
    g = read_any(args.input)
    if args.sh_degree is not None and args.sh_degree < g.max_sh_degree:
        g = with_sh_degree(g, args.sh_degree)
    for note in write_any(args.output, g):
        print(f"note: {note}", file=sys.stderr)
    size = Path(args.output).stat().st_size
    print(f"wrote {len(g)} Gaussians (SH degree {g.max_sh_degree}) to {args.output} "
          f"({format_for_path(args.output)}, {size / 1e6:.2f} MB)")
    return 0

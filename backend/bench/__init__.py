"""Benchmarks: `python -m backend bench NAME [options]`."""
from __future__ import annotations

BENCHMARKS = ("raster",)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m backend bench {{{','.join(BENCHMARKS)}}} [options]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "raster":
        from . import raster
        return raster.main(rest)
    print(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")
    return 2

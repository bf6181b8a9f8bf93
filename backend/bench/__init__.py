"""Benchmarks: `python -m backend bench NAME [options]`; each is a module here with main(argv) -> int."""
from __future__ import annotations

import importlib

BENCHMARKS = ("raster", "train", "serve", "profile", "viewport")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m backend bench {{{','.join(BENCHMARKS)}}} [options]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")
        return 2
    return importlib.import_module(f"{__name__}.{name}").main(rest)

"""The server's log: one line a message on stderr (stdout carries the ready line only)."""
from __future__ import annotations

import sys


def log(message: str) -> None:
    print(f"splatwright serve: {message}", file=sys.stderr, flush=True)

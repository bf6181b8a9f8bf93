"""The server's log: one line a message on stderr (stdout carries the ready line only)."""
from __future__ import annotations

import os
import sys


def log(message: str) -> None:
    """Write a line to stderr. Where nobody reads it any more (the pipe of a Blender that died), stdout and stderr
    go to the null device from then on, so that no later write, this module's or another's (a traceback, a
    library's warning), fails: a server stopping after its parent's death must not fail for want of a reader."""
    try:
        print(f"splatwright serve: {message}", file=sys.stderr, flush=True)
    except OSError:  # a broken pipe
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):  # the streams' buffers are written there at their next flush
            os.dup2(null, fd)
        os.close(null)

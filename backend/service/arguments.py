"""The command line's shared parts: the parser that says what is wrong in one line, and the serve command's
options, one definition for `python -m backend serve` (tools/cli.py) and `python -m backend.service`
(__main__.py, the server alone, as the add-on starts it)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Callable

from blender_addon.core import protocol
from blender_addon.core.errors import SplatwrightError
from .limits import Limits


class Parser(argparse.ArgumentParser):
    """Says what is wrong with the command line in one line, `error: ...`, and exits with 2."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind; other than loopback needs --token-file")
    p.add_argument("--port", type=int, default=protocol.DEFAULT_PORT,
                   help="TCP port (0: a free one; the ready line names it)")
    p.add_argument("--token-file", default=None, help="file holding the secret every client must send")
    p.add_argument("--workdir", default="out/sessions", help="folder of the sessions")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    add_group_arguments(p, "train sessions on N GPUs of this host, one process each, while this process serves "
                        "(with --device cpu: N processes on the CPU)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop (with a checkpoint) when the process that started the server ends, however it ends: "
                   "when the pipe it gave as stdin closes, or (POSIX) when it is gone")
    for limit in fields(Limits):
        p.add_argument(Limits.flag(limit.name), type=positive_int, default=limit.default, metavar="N",
                       help=f"most {limit.metadata['help']} (default: {limit.default:,})")


def add_group_arguments(p: argparse.ArgumentParser, gpus_help: str) -> None:
    """--gpus and --parallel: training in several processes (backend/distributed.py)."""
    p.add_argument("--gpus", type=positive_int, default=1, metavar="N", help=gpus_help)
    p.add_argument("--parallel", default="data", choices=["data", "partitioned"],
                   help="how several processes share the work: data (each holds the whole model and draws its share "
                   "of the views) or partitioned (each holds a share of the Gaussians, by space: for models beyond "
                   "one GPU's memory)")


def run(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """command(args)'s exit code; a SplatwrightError is told in one line, `error: ...`, and exits with 1."""
    try:
        return command(args)
    except SplatwrightError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

"""Scenarios in a real Blender window (Debian's Blender 3.4 under Xvfb, for the benchmarks and the windowed
tests): a scenario is a generator that yields the seconds until its next step, so the window goes on drawing
and the add-on's timers run between steps. Imports nothing outside the standard library but bpy."""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import bpy


def arguments() -> dict:
    """The script's `-- --name value ...` arguments, by name."""
    argv = sys.argv[sys.argv.index("--") + 1:]
    return {argv[i].lstrip("-"): argv[i + 1] for i in range(0, len(argv), 2)}


def until(condition, what: str, timeout: float):
    """Yield (let Blender run) until condition() holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        yield 0.05


def data_writable(datablock) -> bool:
    """Whether Blender lets scripts change data again: a render job's end runs on the main thread a little after
    bpy.app.is_job_running says it is over, and until then writes to ID data are refused."""
    try:
        datablock.name = datablock.name
    except AttributeError:
        return False
    return True


def run_in_window(scenario) -> None:
    """Run scenario(args, result) step by step from a Blender timer, then write its result (with `failure` and
    `traceback` if it raised) to the --out folder's result.json and quit Blender."""
    bpy.context.preferences.view.show_splash = False  # read before the splash would open, after the script
    args = arguments()
    result: dict = {}
    steps = scenario(args, result)
    finished = False

    def step():
        nonlocal finished
        if not finished:
            try:
                return next(steps)
            except StopIteration:
                pass
            except Exception as e:
                result.update(failure=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
            out = Path(args["out"])
            out.mkdir(parents=True, exist_ok=True)
            (out / "result.json").write_text(json.dumps(result, default=str))
            finished = True
        try:
            bpy.ops.wm.quit_blender()
        except RuntimeError:  # refused while Blender draws or ends a render job ("can't modify blend data")
            return 0.1
        return None
    bpy.app.timers.register(step, first_interval=0.5)

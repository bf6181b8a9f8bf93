"""A new user's path in the bpy module: Blender's startup scene, the add-on freshly installed with its defaults
(those of this machine's device), and nothing pressed but the main panel's main button each time, until a trained
model is in the scene and drawn. Counts the add-on's buttons pressed, the settings the main panel always shows, and
the training's time left as the panel showed it against the time it really took. Prints `RESULT <json>`.

    PYTHONPATH=tests python tests/blender/scenarios/first_run.py --zip Z --out DIR --python PY
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import bpy

from blender.kit import addon, blender_reports, pump, report, stop_and_disable, wait_for

MAX_CLICKS = 6  # the scenario gives up past this


class Recording:
    """A UILayout stand-in that records the props and operators drawn, in order, with the rows' heights."""

    def __init__(self, drawn: list, scale_y: float = 1.0):
        self.drawn, self.scale_y, self.enabled, self.active, self.alert = drawn, scale_y, True, True, False

    def _nested(self, *args, **kwargs):
        return Recording(self.drawn, self.scale_y)

    row = column = box = grid_flow = split = _nested

    def prop(self, data, name, **kwargs):
        assert hasattr(data, name), f"no property {name!r}"
        self.drawn.append(("prop", name, self.scale_y))

    def operator(self, idname, **kwargs):
        self.drawn.append(("op", idname, self.scale_y))
        return type("Props", (), {})()

    def label(self, text="", **kwargs):
        self.drawn.append(("label", text, self.scale_y))

    def progress(self, factor=0.0, text="", **kwargs):
        self.drawn.append(("progress", text, self.scale_y))

    def separator(self, **kwargs):
        pass


class Panel:
    def __init__(self, drawn):
        self.layout = Recording(drawn)

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)


def main_panel() -> list:
    drawn: list = []
    panel = Panel(drawn)
    addon().ui.panels.SPLATWRIGHT_PT_main.draw(panel, bpy.context)
    # scale_y is set after the row is made: read it back from the rows the kit made
    return drawn


def primary_button(drawn: list) -> str:
    ops = [name for kind, name, _ in drawn if kind == "op"]
    return ops[0] if ops else ""


def shown_in_viewport(session: str) -> bool:
    a = addon()
    objects = [o for o in a.scene.splats.splat_objects(bpy.context.scene) if o[a.scene.splats.SESSION_KEY] == session]
    return bool(objects) and not a.ui.panels.problem(objects[0], bpy.context.scene)


def run(zip_path: Path, out: Path, python: str) -> dict:
    bpy.ops.wm.read_factory_settings()  # Blender's startup scene: the cube, a camera, a light
    bpy.ops.preferences.addon_install(filepath=str(zip_path), overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    a = addon()
    live = a.scene.live
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = python, str(out / "sessions")  # what Set Up Backend would have made
    time.sleep(1.1)
    pump()  # the settings take this machine's device's defaults
    s = bpy.context.scene.splatwright
    result: dict = {"defaults_device": s.defaults_device, "unsaved_folder": str(a.scene.folders.dataset_root(s.folder))}
    first = main_panel()
    result["main_panel_settings"] = [name for kind, name, _ in first if kind == "prop"]
    result["main_panel_first"] = first
    clicks: list[str] = []
    eta: list[tuple[float, int, int, float | None]] = []  # (time, step, total, seconds left shown)
    session = ""
    while len(clicks) < MAX_CLICKS:
        button = primary_button(main_panel())
        if not button:
            raise AssertionError(f"no button in the main panel: {main_panel()}")
        clicks.append(button)
        group, name = button.split(".")
        returned = getattr(bpy.ops.splatwright, name)()
        assert returned == {"FINISHED"}, (button, returned)

        def settled() -> bool:
            b = live.backend
            flow = a.ops.flow.running_flow()
            state = b.status.get("state")
            if state == "training":
                eta.append((time.monotonic(), b.status.get("step", 0), b.status.get("iterations", 0),
                            b.clock.remaining(time.monotonic())))
            return not flow and not b.in_flight and b.connection == "connected" and state not in ("training",)
        wait_for(settled, f"after {button}", timeout=900)
        session = live.backend.status.get("session", "")
        if shown_in_viewport(session):
            break
    result.update(clicks=clicks, session=session, status=dict(live.backend.status), shown=shown_in_viewport(session),
                  eta=eta, reports=blender_reports.lines, last_error=live.backend.last_error,
                  capture_folder=s.capture_folder)
    stop_and_disable()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zip", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", required=True, help="the backend's Python (with torch)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return report(lambda: run(Path(args.zip), out, args.python))


if __name__ == "__main__":
    sys.exit(main())

"""The sidebar in a real Blender window (Debian's Blender 3.4 under Xvfb, run by test_sidebar_gui.py) at 1920x1080
with the sidebar at its default width and Blender's default UI scale: the Splats tab open, the add-on installed
from its zip into fresh user folders, Capture & Train pressed on the startup scene. While idle, capturing and
training, every text each panel draws is measured with blf in the UI font against the width its widget has in
the region, the main panel's button, state line and progress bar are placed within the region's height, the
status bar's text is kept, and screenshots are taken. Writes result.json into --out, then quits.

    PYTHONPATH=tests:. blender --factory-startup --enable-event-simulate -p 0 0 1920 1080 --python tests/blender/scenarios/sidebar_gui.py \
        -- --zip Z --python PY --out DIR
"""
from __future__ import annotations

import sys
from pathlib import Path

import blf
import bpy

from backend.tools.bench.windowed import run_in_window, until

UNIT = 20  # Blender's UI_UNIT_X and UI_UNIT_Y at scale 1
TABS = 20  # the sidebar's column of category tabs
PANEL_MARGIN = 12  # each side of a panel's content, the panel's outline included
TEXT_MARGIN = 8  # each side of a widget's text
ICON = 20  # an icon and its gap
HEADER = 26  # a panel's header


class Box:
    """A layout container as drawn: its kind and what was put in it, in order."""

    def __init__(self, kind: str, parent=None, columns: int = 1):
        self.kind, self.parent, self.columns, self.items, self.scale_y = kind, parent, columns, [], 1.0
        if parent is not None:
            parent.items.append(self)

    def share(self) -> float:
        """This box's share of the panel's width."""
        if self.parent is None:
            return 1.0
        p = self.parent
        n = len(p.items) if p.kind == "row" else (p.columns if p.kind == "grid" else 1)
        return p.share() / max(1, n)

    def height(self) -> float:
        heights = [item.height() if isinstance(item, Box) else UNIT * self.scale_y for item in self.items]
        if not heights:
            return 0.0
        return max(heights) if self.kind == "row" else sum(heights)


class Item:
    def __init__(self, box: Box, kind: str, text: str, icon: bool, extra: float = 0.0, fraction: float = 1.0):
        self.box, self.kind, self.text, self.icon, self.extra, self.fraction = box, kind, text, icon, extra, fraction
        box.items.append(self)

    def height(self) -> float:
        return UNIT * self.box.scale_y


class Proxy:
    """Forwards to a real UILayout (or to none) and notes what is drawn in a Box."""

    def __init__(self, layout, box: Box):
        object.__setattr__(self, "_layout", layout)
        object.__setattr__(self, "_box", box)

    def __setattr__(self, name, value):
        if name == "scale_y":
            self._box.scale_y = value
        if self._layout is not None:
            setattr(self._layout, name, value)

    def __getattr__(self, name):
        return getattr(self._layout, name) if self._layout is not None else None

    def _nest(self, kind, method, **kwargs):
        columns = kwargs.get("columns", 1) if kind == "grid" else 1
        real = getattr(self._layout, method)(**kwargs) if self._layout is not None else None
        return Proxy(real, Box(kind, self._box, columns))

    def row(self, **kw):
        return self._nest("row", "row", **kw)

    def column(self, **kw):
        return self._nest("column", "column", **kw)

    def box(self, **kw):
        return self._nest("column", "box", **kw)

    def grid_flow(self, **kw):
        return self._nest("grid", "grid_flow", **kw)

    def label(self, text="", icon="NONE", **kw):
        Item(self._box, "label", text, icon != "NONE")
        return self._layout.label(text=text, icon=icon, **kw) if self._layout is not None else None

    def operator(self, idname, text=None, icon="NONE", **kw):
        group, name = idname.split(".")
        label = text if text is not None else getattr(getattr(bpy.ops, group), name).get_rna_type().name
        Item(self._box, "operator", label, icon != "NONE")
        if self._layout is not None:
            return self._layout.operator(idname, icon=icon, **({"text": text} if text is not None else {}), **kw)
        return type("Props", (), {})()

    def prop(self, data, name, text=None, **kw):
        rna = data.bl_rna.properties[name]
        label = rna.name if text is None else text
        value = getattr(data, name)
        if name == "splatwright_progress":  # Blender 3.x's progress bar (ui/kit.py)
            Item(self._box, "progress", label, False)
        elif rna.type == "ENUM" and kw.get("expand"):  # a button for each item, side by side
            names = [item.name for item in rna.enum_items]
            row = Box("row", self._box)
            for item_name in names:
                Item(row, "prop-menu", item_name, False)
        elif rna.type == "ENUM":  # "Name:" beside a menu of the chosen item
            chosen = rna.enum_items[value].name
            Item(self._box, "prop-label", f"{label}:", False, fraction=0.4)
            Item(self._box, "prop-menu", chosen, False, extra=ICON, fraction=0.6)
        elif rna.type == "BOOLEAN":
            Item(self._box, "prop", label, True)
        elif rna.type == "STRING":
            Item(self._box, "prop-label", f"{label}:", False, fraction=0.4)
        elif rna.type in ("INT", "FLOAT") and getattr(rna, "array_length", 0) == 0:
            shown = f"{value}" if rna.type == "INT" else f"{value:.3g}"
            Item(self._box, "prop", f"{label}: {shown}" if label else shown, False, extra=2 * TEXT_MARGIN)
        if self._layout is not None:
            return self._layout.prop(data, name, **({"text": text} if text is not None else {}), **kw)

    def progress(self, factor=0.0, text="", **kw):
        Item(self._box, "progress", text, False)
        return self._layout.progress(factor=factor, text=text, **kw) if self._layout is not None else None

    def separator(self, **kw):
        return self._layout.separator(**kw) if self._layout is not None else None


class PanelProxy:
    def __init__(self, panel, layout, box):
        self._panel, self.layout = panel, Proxy(layout, box)

    def __getattr__(self, name):
        return getattr(self._panel, name)


drawn: dict[str, Box] = {}  # panel class name -> what it drew last in the window


def watch(panel_class) -> None:
    """Note what the panel draws in the window, each time it draws."""
    draw = panel_class.draw

    def watched(self, context):
        box = Box("column")
        draw(PanelProxy(self, self.layout, box), context)
        drawn[panel_class.__name__] = box
    panel_class.draw = watched
    panel_class._unwatched = draw


def draw_offscreen(panel_class, context) -> Box:
    """What a folded panel would draw, noted without a layout."""
    box = Box("column")
    panel_class._unwatched(PanelProxy(None, None, box), context)
    return box


def items(box: Box):
    for item in box.items:
        if isinstance(item, Box):
            yield from items(item)
        else:
            yield item


def measure(box: Box, width: float, scale: float) -> list[dict]:
    """Each text against the width its widget has: [{text, kind, text_px, room_px}]."""
    out = []
    for item in items(box):
        if not item.text:
            continue
        room = width * item.box.share() * item.fraction - 2 * TEXT_MARGIN * scale - (ICON * scale if item.icon else 0) \
            - item.extra * scale
        out.append({"text": item.text, "kind": item.kind, "text_px": blf.dimensions(0, item.text)[0],
                    "room_px": room})
    return out


def offset_of(box: Box, kind: str) -> float | None:
    """How far below the panel's top the first item of `kind` ends, in pixels at scale 1."""
    y = 0.0

    def walk(b: Box) -> float | None:
        nonlocal y
        for item in b.items:
            if isinstance(item, Box):
                if b.kind == "row":
                    continue
                found = walk(item)
                if found is not None:
                    return found
            else:
                y += item.height() if b.kind != "row" or item is b.items[0] else 0.0
                if item.kind == kind:
                    return y
        return None
    return walk(box)


def sidebar():
    window = bpy.context.window_manager.windows[0]
    area = max((a for a in window.screen.areas if a.type == "VIEW_3D"), key=lambda a: a.width * a.height)
    region = next(r for r in area.regions if r.type == "UI")
    return window, area, region


def snapshot(addon, name: str, out: Path, result: dict) -> None:
    """Measure what the panels draw now, where the main panel's parts are, and take a screenshot."""
    window, area, region = sidebar()
    scale = bpy.context.preferences.system.ui_scale or 1.0
    blf.size(0, bpy.context.preferences.ui_styles[0].widget_label.points * scale)
    width = region.width - (TABS + 2 * PANEL_MARGIN) * scale
    panels = addon.ui.panels
    measured = []
    for cls in panels.CLASSES:
        box = drawn.get(cls.__name__) if cls is panels.SPLATWRIGHT_PT_main else None
        with bpy.context.temp_override(window=window, area=area, region=region):
            box = box or draw_offscreen(cls, bpy.context)
        measured += [{**m, "panel": cls.__name__} for m in measure(box, width, scale)]
    main = drawn[panels.SPLATWRIGHT_PT_main.__name__]
    ends = {kind: offset_of(main, kind) for kind in ("operator", "progress")}
    path = out / f"sidebar_{name}.png"
    with bpy.context.temp_override(window=window, area=area):
        bpy.ops.screen.screenshot(filepath=str(path), check_existing=False)
    result[name] = {"measured": measured, "region": [region.width, region.height], "scale": scale,
                    "ends": {k: (HEADER + v) * scale if v is not None else None for k, v in ends.items()},
                    "status_bar": list(addon.ui.statusbar.shown), "screenshot": str(path),
                    "main_texts": [i.text for i in items(main)]}


def redrawn(area):
    """Yield until the main panel has drawn again."""
    drawn.pop("SPLATWRIGHT_PT_main", None)
    area.tag_redraw()
    yield from until(lambda: "SPLATWRIGHT_PT_main" in drawn, "the sidebar redraws", 20)


def scenario(args: dict, result: dict):
    out = Path(args["out"])
    out.mkdir(parents=True, exist_ok=True)
    bpy.ops.preferences.addon_install(filepath=args["zip"], overwrite=True)
    bpy.ops.preferences.addon_enable(module="splatwright")
    addon = sys.modules["splatwright"]
    live = addon.scene.live
    prefs = bpy.context.preferences.addons["splatwright"].preferences
    prefs.python, prefs.workdir = args["python"], str(out / "sessions")
    # The sidebar holds the Splats tab and Item (Blender's own C panels stay; the others' go).
    others = [cls for cls in bpy.types.Panel.__subclasses__() if getattr(cls, "bl_space_type", "") == "VIEW_3D"
              and getattr(cls, "bl_region_type", "") == "UI" and not cls.__name__.startswith("SPLATWRIGHT")]
    for _ in range(4):  # sub-panels before their parents
        for cls in others:
            if getattr(cls, "is_registered", False):
                try:
                    bpy.utils.unregister_class(cls)
                except RuntimeError:
                    pass
    result["other_tabs_left"] = [c.__name__ for c in others if getattr(c, "is_registered", False)]
    classes = addon.ui.panels.CLASSES
    for cls in reversed(classes):  # registered again, so Blender calls the watched draw
        bpy.utils.unregister_class(cls)
    for cls in classes:
        watch(cls)
        bpy.utils.register_class(cls)
    window, area, region = sidebar()
    area.spaces.active.show_region_ui = True
    yield 0.5
    # Blender 3.4 cannot choose a sidebar tab from Python either: click the Splats tab on the region's right edge.
    top = region.y + region.height
    for offset in range(30, 400, 8):
        drawn.clear()
        x, y = region.x + region.width - 10, top - offset
        window.event_simulate(type="MOUSEMOVE", value="NOTHING", x=x, y=y)
        window.event_simulate(type="LEFTMOUSE", value="PRESS", x=x, y=y)
        window.event_simulate(type="LEFTMOUSE", value="RELEASE", x=x, y=y)
        yield 0.2
        area.tag_redraw()
        yield 0.2
        if "SPLATWRIGHT_PT_main" in drawn:
            break
    window.event_simulate(type="MOUSEMOVE", value="NOTHING", x=region.x - 300, y=top - 300)
    yield 1.5  # the settings take the CPU's defaults (a timer, once a second)
    yield from redrawn(area)
    snapshot(addon, "idle", out, result)
    # The views render with Workbench: now and then Debian's Blender 3.4 crashes starting a Cycles render on a
    # busy machine (a segfault in Cycles' create), and what the panels draw does not depend on the renderer. More
    # of them keep the capture going while its snapshot is taken, Workbench being quick.
    settings = bpy.context.scene.splatwright
    bpy.context.scene.render.engine, settings.render_engine, settings.orbit_count = "BLENDER_WORKBENCH", "SCENE", 48
    with bpy.context.temp_override(window=window, area=area, region=next(r for r in area.regions if r.type == "WINDOW")):
        result["pressed"] = list(bpy.ops.splatwright.capture_train("INVOKE_DEFAULT"))
    yield from until(lambda: live.capture is not None and live.capture.done >= 2, "the capture's views", 180)
    yield 1.2  # the status bar's redraw timer
    yield from redrawn(area)
    snapshot(addon, "capture", out, result)
    yield from until(lambda: live.backend.status.get("state") == "training"
                     and live.backend.status.get("step", 0) >= 10, "training", 300)
    yield 1.2
    yield from redrawn(area)
    snapshot(addon, "training", out, result)
    bpy.ops.splatwright.train_stop()
    yield from until(lambda: live.backend.status.get("state") == "stopped" and not live.backend.in_flight, "stop", 60)
    bpy.ops.splatwright.backend_stop()
    yield from until(lambda: live.backend.connection == "disconnected" and not live.backend.in_flight, "backend", 60)
    result["errors"] = live.backend.last_error


run_in_window(scenario)

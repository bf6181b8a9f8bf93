"""The panels' kit: the sidebar's tab, the main button, operator buttons whose panel says in one line why they
are disabled, wrapped labels, progress bars and durations."""
from __future__ import annotations

import bpy

from ..logic.messages import wrap
from . import properties

PRIMARY_SCALE = 1.5  # the main button's height, in rows


CHAR_PIXELS = 7.0  # the width of a character of the UI font at scale 1, a little over the average


LABEL_MARGIN_PIXELS = 48  # the panel's margins and a label's icon


DEFAULT_REGION_PIXELS = 300  # where there is no region to measure (a script drawing the panel)


def buttons(layout, context, *ops, icons=(), texts=(), explain_first=None) -> None:
    """Operator buttons (disabled by their poll) one under the other, so their labels fit the sidebar's default
    width, then one line that says why the first disabled one cannot run; `texts`: shorter labels than the
    operators' own where the panel's title says the rest; `explain_first`: the operator whose reason the line
gives before the others'."""
    col = layout.column(align=True)
    for i, op in enumerate(ops):
        text = {"text": texts[i]} if i < len(texts) else {}  # else the operator's own, translated
        col.operator(op.bl_idname, icon=icons[i] if i < len(icons) else "NONE", **text)
    reason_line(layout, context, *((explain_first,) if explain_first else ()), *ops)


def reason_line(layout, context, *ops) -> None:
    """The panel's one line saying why a button cannot run: the first of `ops` that is blocked (each button's
    tooltip says its own)."""
    reason = next((r for op in ops if (r := op.blocked(context))), "")
    if reason:
        labels(layout, context, reason, icon="INFO")


def primary(layout, op, icon: str = "NONE", text: str | None = None) -> None:
    """The panel's main button: full width and taller than the rest."""
    row = layout.row()
    row.scale_y = PRIMARY_SCALE
    row.operator(op.bl_idname, icon=icon, **({"text": text} if text is not None else {}))


def labels(layout, context, text: str, icon: str = "NONE") -> None:
    """`text` as labels wrapped to the panel's width, the icon on the first."""
    region = context.region
    scale = context.preferences.system.ui_scale or 1.0  # 0 in Blender without a window
    width = region.width if region is not None else DEFAULT_REGION_PIXELS * scale
    col = layout.column(align=True)
    for i, line in enumerate(wrap(text, int((width - LABEL_MARGIN_PIXELS * scale) / (CHAR_PIXELS * scale)))):
        col.label(text=line, icon=icon if i == 0 or icon == "NONE" else "BLANK1")


def progress(layout, factor: float, text: str) -> None:
    """A progress bar; Blender 3.x has none, so a read-only slider shows the factor there (one per panel: it
    reads the value when the panel's layout ends)."""
    if bpy.app.version >= (4, 0, 0):
        layout.progress(factor=factor, type="BAR", text=text)
    else:
        properties.progress_shown[0] = 100.0 * factor
        layout.prop(bpy.context.window_manager, "splatwright_progress", text=text, slider=True)


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h {seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m {seconds % 60:02d}s"


class SplatsPanel:
    bl_space_type = "VIEW_3D"
    bl_region_type = "UI"
    bl_category = "Splats"


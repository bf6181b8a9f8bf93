"""The panel's training settings (Scene.splatwright) as start_training fields (bpy-free); names, ranges and
defaults come from the one table, core/settings.py."""
from __future__ import annotations

from ..core.settings import FAR_FIELD_POINTS, default

NATIVE_CONTEXT = "blender-5.3"  # core/settings.CONTEXT_DEFAULTS: the add-on where Blender draws splats itself
BACKGROUNDS = {"WHITE": [1.0, 1.0, 1.0], "BLACK": [0.0, 0.0, 0.0]}  # the rest: the chosen colour


def background_rgb(choice: str, color) -> list[float]:
    return list(BACKGROUNDS.get(choice) or [float(c) for c in color])


def training_fields(s, fresh: bool = True, native_splats: bool = False) -> dict:
    """start_training fields of the panel's settings `s` (source, preset, custom_steps, iterations, sh_degree,
    max_gaussians, background, background_color); what the panel leaves to the schedule is not sent. Where
    Blender draws the splats itself (`native_splats`), the model is trained for the way it draws them; real photos
    train with per-photo appearance (their exposure varies) and a far field (their points cover what structure
    from motion matched, not the background)."""
    fields = {"preset": s.preset.lower(), "sh_degree": s.sh_degree,
              "background": background_rgb(s.background, s.background_color), "fresh": fresh}
    if native_splats:
        fields["image_formation"] = default("image_formation", NATIVE_CONTEXT)
    if s.source == "PHOTOS":
        fields.update(appearance="on", far_field=FAR_FIELD_POINTS)
    if s.custom_steps:
        fields["iterations"] = s.iterations
    if s.max_gaussians:
        fields["max_gaussians"] = s.max_gaussians
    return fields

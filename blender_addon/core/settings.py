"""The training settings: one table of names, ranges, defaults and meanings, read by the backend's CLI, the
protocol's start_training request, the trainer's configuration and the add-on's panel; the one place a
setting's default is stated. A value of None leaves the choice to the schedule the backend picks for its
device (backend/policy.py), whose own values are that schedule's."""
from __future__ import annotations

from .schema import Fields, Float, Int, Maybe, Numbers, Str, optional

# The GPU schedules (backend/policy.py builds them from these): their steps, and the steps a training view they
# stretch to on many views (0: none). The CPU reference path runs a short schedule of CPU_STEPS.
SCHEDULE_STEPS = {"quality": (12_000, 110), "fast": (6500, 65), "dynamic": (15_000, 0)}
PRESETS = tuple(SCHEDULE_STEPS)
CPU_STEPS = 3000
BACKGROUND = Numbers((3,), 0.0, 1.0)
# How the model's splats make an image, which it is trained to look right in (backend/render/formation.py):
# standard 3DGS viewers', or Blender 5.3's own drawing of native splats (Cycles and EEVEE).
FORMATIONS = ("standard", "blender")
# The axes an SPZ that does not say its own is read in (backend/formats/spz.py): the PLY's, as SuperSplat and
# splat-transform store them (the default), or RUB, as the SPZ specification says and Niantic's tools store them.
SPZ_AXES = ("ply", "rub")
# Per-photo appearance (backend/appearance.py): auto trains it for photos (a COLMAP dataset), whose exposure
# varies, and not for Blender's captures, whose exposure is constant.
APPEARANCE = ("auto", "on", "off")
# Gaussians a COLMAP capture's sparse points are joined by on a far sphere, for the background that structure from
# motion leaves without points (backend/gaussians.py's far_field); a Blender capture's points start none, and a
# server session's (whose points do not say where they come from) only where the setting asks.
FAR_FIELD_POINTS = 2000

TRAINING = Fields(
    preset=optional(Str(choices=PRESETS), "quality",
                    "GPU schedule: quality, fast, or dynamic (for 4D captures over time); the CPU runs a short one"),
    iterations=optional(Maybe(Int(1, 10_000_000)), None,
                        "training steps (default: the preset's on the GPU, the short schedule's on the CPU)"),
    sh_degree=optional(Int(0, 3), 3, "spherical harmonics degree of the view-dependent colour"),
    max_gaussians=optional(Maybe(Int(0, 100_000_000)), None,
                           "most Gaussians densification may make (0: no cap; default: the schedule's)"),
    init_points=optional(Maybe(Int(1, 10_000_000)), None,
                         "random initial Gaussians when there are no initial points (default: the schedule's)"),
    far_field=optional(Maybe(Int(0, 10_000_000)), None,
                       "Gaussians on a far sphere around the initial points, for the background they miss "
                       f"(default: {FAR_FIELD_POINTS} for a COLMAP capture's points on the command line, else none; "
                       "0: none)"),
    background=optional(BACKGROUND, [1.0, 1.0, 1.0], "colour the views are composited over, r,g,b in [0, 1]"),
    checkpoint_every=optional(Int(0, 10_000_000), 500, "steps between checkpoints (0: only at stop and finish)"),
    checkpoint_seconds=optional(Float(0.0, 86_400.0), 30.0,
                                "seconds of training between checkpoints, besides the steps (0: by steps only)"),
    progress_interval=optional(Float(0.05, 3600.0), 0.5, "seconds between progress reports"),
    seed=optional(Int(0, 2**31 - 1), 0, "random seed of the initialisation"),
    image_formation=optional(Str(choices=FORMATIONS), "standard",
                             "the image formation the model is trained for: standard (3DGS viewers) or blender "
                             "(Blender 5.3's native splats: linear-light blending, ray-space splats); the CUDA "
                             "kernels train the standard one"),
    appearance=optional(Str(choices=APPEARANCE), "auto",
                        "a colour transform per training photo (gain and offset per channel), trained with the "
                        "model, for photos whose exposure varies; not part of the model. auto: on for photos (a "
                        "COLMAP dataset), off for Blender captures"),
)

# Where a context starts a setting elsewhere than the table does (the table's defaults are the backend's: the
# CLI's and the protocol's). The panel's Steps, per backend device: the count Custom Steps trains. The add-on on
# Blender 5.3 and later, where a model becomes a native splat object that Blender draws itself, trains for
# Blender's image formation ("blender-5.3").
CONTEXT_DEFAULTS = {
    "panel-cuda": {"iterations": 7000},
    "panel-cpu": {"iterations": 300},
    "blender-5.3": {"image_formation": "blender"},
}


def default(name: str, context: str | None = None):
    """A training setting's default, in `context` (a key of CONTEXT_DEFAULTS) or as the backend fills it in."""
    return CONTEXT_DEFAULTS.get(context, {}).get(name, TRAINING.fields[name].default)


def training_settings(**chosen) -> dict:
    """The whole settings dict: `chosen` checked against the table, every other setting at its default."""
    return TRAINING.check(TRAINING.encode(chosen))


def stretched_steps(steps: int, steps_per_view: int, views: int) -> int:
    """The steps of a schedule of `steps` that stretches to `steps_per_view` on `views` training views."""
    return max(steps, steps_per_view * views)

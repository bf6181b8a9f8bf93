"""Per-scene settings of capture and training (Scene.splatwright), which start at the defaults of the connected
backend's device (logic/defaults.py) until the user changes them."""
from __future__ import annotations

import bpy
from bpy.props import BoolProperty, EnumProperty, FloatProperty, FloatVectorProperty, IntProperty, StringProperty

from ..core.reconstruction import DEFAULT_RATE, MAX_RATE, MIN_RATE
from ..core.settings import PRESETS, TRAINING, default
from ..logic.defaults import DEVICE_DEFAULTS, GPU, defaults_for, device_of, machine_device
from ..scene import live

START = DEVICE_DEFAULTS[GPU]  # the properties' defaults: a GPU backend's
FOLLOW_INTERVAL = 1.0  # seconds between checks of the connected backend's device
progress_shown = [0.0]  # percent: what the next progress bar on Blender 3.x shows (panels.progress)


class SPLATWRIGHT_PG_settings(bpy.types.PropertyGroup):
    # Capture
    source: EnumProperty(name="From", default="ORBIT", items=[
        ("ORBIT", "Orbit", "Generated cameras around the selection or the scene"),
        ("CAMERAS", "Scene Cameras", "One view from each camera object of the scene"),
        ("ANIMATION", "Animation", "The active camera over the animation range, each view at its frame's time"),
        ("RIG_ANIMATION", "Animated Rig", "The scene's camera objects (the orbit's cameras where it has "
                                          "none) at every captured frame: multi-view video for a 4D model"),
        ("PHOTOS", "Photos", "Real photos or a video, made into cameras and points (Make Cameras from Photos), or "
                             "a COLMAP import's"),
    ], description="Where the splats come from: the views a capture renders, or real photos")
    photos_path: StringProperty(name="Photos", subtype="FILE_PATH", default="",
                                description="A folder of photos (or any photo in it) or a video, which Make Cameras "
                                            "from Photos makes into cameras and points")
    video_rate: FloatProperty(name="Frames a Second", default=DEFAULT_RATE, min=MIN_RATE, max=MAX_RATE,
                              description="Frames taken a second of a video (of each run of near-duplicates, the "
                                          "sharpest)")
    only_selected: BoolProperty(name="Only Selected", description="Only the selected camera objects")
    frame_step: IntProperty(name="Every N Frames", default=10, min=1)
    moving_scene: BoolProperty(name="Moving (4D)", default=True,
                               description="Each view carries its frame's time, and the session trains a 4D model; "
                                           "off: the scene stands still and the animation only moves cameras")
    orbit_shape: EnumProperty(name="Shape", default="HEMISPHERE", items=[
        ("SPHERE", "Sphere", "Cameras all around"), ("HEMISPHERE", "Hemisphere", "Cameras above the horizon")])
    orbit_target: EnumProperty(name="Around", default="SELECTION", items=[
        ("SELECTION", "Selection", "The selected objects' bounds (the scene's when nothing is selected)"),
        ("SCENE", "Scene", "The bounds of all visible geometry")])
    orbit_count: IntProperty(name="Views", default=START["orbit_count"], min=1, max=2000,
                             description="How many cameras the orbit places")
    orbit_radius: FloatProperty(name="Radius", default=0.0, min=0.0, unit="LENGTH",
                                description="Distance from the centre (0: fit the bounds in view)")
    orbit_lens: FloatProperty(name="Focal Length", default=50.0, min=1.0, unit="CAMERA")
    orbit_seed: IntProperty(name="Seed", default=0, min=0)
    resolution_percentage: IntProperty(name="Resolution Scale", default=START["resolution_percentage"], min=1,
                                       max=100, subtype="PERCENTAGE",
                                       description="Render the views at this share of the scene's resolution")
    max_side: IntProperty(name="Longest Side", default=START["max_side"], min=0, max=16384, subtype="PIXEL",
                          description="Scale the views down further so their longer side has at most this many "
                                      "pixels (0: no limit)")
    render_engine: EnumProperty(name="Engine", default=START["render_engine"], items=[
        ("SCENE", "Scene's", "The scene's render engine (Cycles while it is Splatwright)"),
        ("CYCLES", "Cycles", "Cycles, whatever the scene's engine is"),
    ])
    samples: IntProperty(name="Samples", default=START["samples"], min=0, max=65536,
                         description="Samples per pixel of the views' Cycles or Eevee renders (0: the scene's own)")
    test_every: IntProperty(name="Test Every", default=8, min=0,
                            description="Hold out every N-th view for testing (0: train on all views)")
    folder: StringProperty(name="Folder", subtype="DIR_PATH", default="//splatwright",
                           description="Each capture writes a NeRF-synthetic dataset into a new subfolder here (a "
                                       "folder beside the .blend: the add-on's data folder while it is unsaved)")
    transparent: BoolProperty(name="Transparent", default=True,
                              description="Render RGBA with a transparent world; training composites the background")
    initial_points: BoolProperty(name="Points from Meshes", default=True,
                                 description="Start the Gaussians on the surfaces of the visible meshes, in their colours")
    point_count: IntProperty(name="Points", default=START["point_count"], min=100, max=5_000_000)
    session: StringProperty(name="Session", default="",
                            description="The scene's backend session: the last capture's (or an imported "
                                        "file's, in a scene without one); final renders reopen it when the "
                                        "backend shows nothing yet")
    capture_folder: StringProperty(name="Last Capture", default="", subtype="DIR_PATH",
                                   description="The dataset folder of the last capture, which Send to Backend sends")
    defaults_device: StringProperty(default=GPU, options={"HIDDEN"},
                                    description="The backend device whose defaults these settings started at")

    # Training (names and defaults as in the backend's table, core/settings.py)
    preset: EnumProperty(name="Preset", default=default("preset").upper(), items=[
        (name.upper(), name.capitalize(), f"The backend's {name} GPU schedule (the CPU runs a short one)")
        for name in PRESETS])
    custom_steps: BoolProperty(name="Custom Steps", default=START["custom_steps"],
                               description="Train for a chosen number of steps instead of the preset's")
    iterations: IntProperty(name="Steps", default=START["iterations"], min=1)
    sh_degree: IntProperty(name="SH Degree", default=default("sh_degree"), min=0, max=3,
                           description=TRAINING.fields["sh_degree"].help.capitalize())
    max_gaussians: IntProperty(name="Max Gaussians", default=0, min=0,
                               description="Most Gaussians densification may make (0: the schedule's default)")
    background: EnumProperty(name="Background", default="WHITE", items=[
        ("WHITE", "White", ""), ("BLACK", "Black", ""), ("CUSTOM", "Color", "")])
    background_color: FloatVectorProperty(name="Color", subtype="COLOR_GAMMA", size=3, min=0.0, max=1.0,
                                          default=(0.5, 0.5, 0.5))


def adopt_device_defaults(scene, device: str) -> bool:
    """Give the scene the defaults of the backend's device, unless the user changed its settings since they
    were the defaults of the device before. True if they changed."""
    s, device = scene.splatwright, device_of(device)
    if s.defaults_device == device or scene.library is not None:
        return False
    before = defaults_for(s.defaults_device)
    if any(getattr(s, name) != value for name, value in before.items()):
        return False  # the user's own settings
    for name, value in defaults_for(device).items():
        setattr(s, name, value)
    s.defaults_device = device
    return True


def follow_device() -> float:
    """Timer: scenes take the defaults of the device of the backend last connected (new scenes too); before
    one connected, those of the device one started here would most likely have, so a first capture on a
    machine without a GPU is a CPU preview's."""
    b = live.backend
    device = (b.capabilities.get("device") if b is not None else None) or machine_device()
    if device:
        for scene in bpy.data.scenes:
            adopt_device_defaults(scene, device)
    return FOLLOW_INTERVAL


def register():
    bpy.utils.register_class(SPLATWRIGHT_PG_settings)
    bpy.types.Scene.splatwright = bpy.props.PointerProperty(type=SPLATWRIGHT_PG_settings)
    bpy.types.WindowManager.splatwright_progress = FloatProperty(
        name="Progress", min=0.0, max=100.0, precision=0, subtype="PERCENTAGE", get=lambda self: progress_shown[0])
    bpy.app.timers.register(follow_device, first_interval=FOLLOW_INTERVAL, persistent=True)


def unregister():
    if bpy.app.timers.is_registered(follow_device):
        bpy.app.timers.unregister(follow_device)
    del bpy.types.WindowManager.splatwright_progress
    del bpy.types.Scene.splatwright
    bpy.utils.unregister_class(SPLATWRIGHT_PG_settings)

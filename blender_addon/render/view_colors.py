"""The inverse of the scene's view transform, so that Blender shows the backend's display values as they are
under any colour management (needs bpy; the mathematics are view_transform.py's).

Blender samples its own transform: Image.save_render of float images of scene-linear colours through a
scene of its own given the scene's colour management, to a 16-bit PNG read back as raw values. That
must happen on the main thread, so a timer does it, a part per tick, and a thread of this module inverts
the samples; the viewport draws without the inverse until it is ready. A render on the main thread (the bpy
module, `blender -b`) builds it at once; one on a render job's thread waits for the timer.
"""
from __future__ import annotations

import atexit
import os
import queue
import tempfile
import threading
import traceback
from collections import OrderedDict

import bpy
import numpy as np
from bpy.app.handlers import persistent

from ..core.errors import SplatwrightError
from ..logic.view_transform import Inverse, grey_inputs, grid_inputs, invert, shaper_of
from ..scene import live

IDLE_INTERVAL = 0.25  # seconds between the timer's looks for an inverse to build
GRID_PARTS = 5  # the grid's samples are made in this many timer ticks
KEPT = 8  # inverses kept for view settings seen before
RENDER_WAIT = 120.0  # seconds a render job waits for its inverse
IMAGE_WIDTH = 4096
SAMPLING_SCENE = ".splatwright view transform"  # the scene whose colour management the samples go through
# The colour management that shows display values as they are: the sRGB curve, colors.py, needs no inverse.
PLAIN_VIEW = {"view_transform": "Standard", "look": "None", "exposure": 0.0, "gamma": 1.0,
              "use_curve_mapping": False, "use_white_balance": False}
PLAIN_DISPLAY = "sRGB"
SETTING_TYPES = {"BOOLEAN", "INT", "FLOAT", "ENUM"}

_changed = threading.Condition()  # guards the four below; notified when an inverse is ready or failed
_inverses: OrderedDict[tuple, Inverse] = OrderedDict()
_failures: dict[tuple, str] = {}  # why an inverse could not be built
_wanted: list[tuple] = []  # view keys asked for, newest last
_inverting: set[tuple] = set()
_sampling = None  # (key, generator of its sampling steps) the timer is at; main thread only
_news = False  # an inverse got ready since the timer last redrew the viewports
_jobs: queue.Queue = queue.Queue()  # samples for the inverting thread
_inverter: threading.Thread | None = None


# ---- the scene's colour management ----

def _settings(owner, first=()) -> tuple:
    """(name, value) of every setting of a colour management struct, those in `first` first (a look is
    valid only after its view transform)."""
    names = [p.identifier for p in owner.bl_rna.properties if not p.is_readonly and p.type in SETTING_TYPES]
    names = [n for n in first if n in names] + [n for n in names if n not in first]
    return tuple((n, _hashable(getattr(owner, n))) for n in names)


def _hashable(value):
    return value if isinstance(value, (bool, int, float, str)) else tuple(value)


def _curves(mapping) -> tuple:
    return (_settings(mapping),
            tuple(tuple((tuple(p.location), p.handle_type) for p in curve.points) for curve in mapping.curves))


def view_key(scene) -> tuple | None:
    """The scene's colour management as a hashable tuple, all that its inverse depends on; None where it is
    Standard on an sRGB display with nothing else, which shows the sRGB curve exactly (colors.py)."""
    view = scene.view_settings
    display, settings = _settings(scene.display_settings), _settings(view, first=("view_transform", "look"))
    values = dict(settings)
    if dict(display).get("display_device") == PLAIN_DISPLAY and all(
            values.get(name, plain) == plain for name, plain in PLAIN_VIEW.items()):
        return None
    return display, settings, _curves(view.curve_mapping) if view.use_curve_mapping else ()


def _apply(key: tuple, scene) -> None:
    """Give `scene` the colour management `key` holds."""
    display, settings, curves = key
    for owner, values in ((scene.display_settings, display), (scene.view_settings, settings)):
        for name, value in values:
            setattr(owner, name, value)
    if curves:
        mapping = scene.view_settings.curve_mapping
        for name, value in curves[0]:
            setattr(mapping, name, value)
        for curve, points in zip(mapping.curves, curves[1]):
            while len(curve.points) < len(points):
                curve.points.new(0.0, 0.0)
            while len(curve.points) > len(points):
                curve.points.remove(curve.points[-1])
            for point, (location, handle_type) in zip(curve.points, points):
                point.location, point.handle_type = location, handle_type
        mapping.update()


# ---- sampling (main thread) ----

def _sampling_scene():
    """The scene the samples go through, made once and kept: removing a scene in the middle of a command-line
    render (`blender -b scene.blend -f 1`, whose render builds its inverse at once) crashes Blender. It goes
    before the file is saved and when the add-on does (_remove_sampling_scene)."""
    return bpy.data.scenes.get(SAMPLING_SCENE) or bpy.data.scenes.new(SAMPLING_SCENE)


@persistent
def _remove_sampling_scene(*args) -> None:
    scenes = getattr(bpy.data, "scenes", None)  # none while Blender restricts its data (registering, exiting)
    scene = scenes.get(SAMPLING_SCENE) if scenes is not None else None
    if scene is not None:
        scenes.remove(scene)


def shown(key: tuple, colors: np.ndarray) -> np.ndarray:
    """Blender's display values (N, 3) of scene-linear `colors` (N, 3) under the colour management `key`."""
    count = len(colors)
    width = min(count, IMAGE_WIDTH)
    height = -(-count // width)
    rgba = np.ones((width * height, 4), np.float32)
    rgba[:count, :3] = colors
    handle, path = tempfile.mkstemp(prefix="splatwright-view-", suffix=".png")
    os.close(handle)
    scene = _sampling_scene()
    image = result = None
    try:
        _apply(key, scene)
        out = scene.render.image_settings
        out.file_format, out.color_mode, out.color_depth, out.compression = "PNG", "RGB", "16", 0
        if hasattr(out, "color_management"):  # Blender 4.x: follow the scene's view, not the output's own
            out.color_management = "FOLLOW_SCENE"
        scene.render.dither_intensity = 0.0
        image = bpy.data.images.new(".splatwright view samples", width, height, alpha=True, float_buffer=True)
        image.pixels.foreach_set(rgba.reshape(-1))
        image.save_render(path, scene=scene)
        result = bpy.data.images.load(path)
        result.colorspace_settings.name = "Non-Color"  # the file's values as they are
        values = np.empty(width * height * 4, np.float32)
        result.pixels.foreach_get(values)
        return values.reshape(-1, 4)[:count, :3]
    finally:
        for made in (image, result):
            if made is not None:
                bpy.data.images.remove(made)
        os.remove(path)


def _sampling_steps(key: tuple):
    """Blender's samples of the transform `key`, one save_render per step; returns (shaper, grid display)."""
    shaper = shaper_of(shown(key, grey_inputs()))
    yield
    parts = []
    for colors in np.array_split(grid_inputs(shaper), GRID_PARTS):
        parts.append(shown(key, colors))
        yield
    return shaper, np.concatenate(parts)


# ---- building and finding inverses ----

def _keep(key: tuple, inverse: Inverse | None, failure: str = "") -> None:
    global _news
    with _changed:
        if inverse is not None:
            _inverses[key] = inverse
            while len(_inverses) > KEPT:
                _inverses.popitem(last=False)
        else:
            _failures[key] = failure
        _inverting.discard(key)
        _news = True
        _changed.notify_all()


def _found(key: tuple, want: bool) -> Inverse | None:
    """The inverse for `key` if built, else None, and with `want` asked for (any thread). Raises
    SplatwrightError where it could not be built."""
    with _changed:
        if key in _failures:
            raise SplatwrightError(f"cannot sample the scene's view transform ({_failures[key]}); colours show as "
                                   "under Standard, which needs no sampling")
        inverse = _inverses.get(key)
        if inverse is None and want and key not in _wanted and key not in _inverting:
            _wanted.append(key)
        return inverse


def ready_inverse(key: tuple) -> Inverse | None:
    """For the viewport: the inverse for `key` if built, else None (the timer builds it and redraws the
    viewports then). Raises SplatwrightError where it could not be built."""
    return _found(key, want=True)


def render_inverse(key: tuple, cancelled) -> Inverse:
    """For a final render: the inverse for `key`. On the main thread it is built at once; on a render job's
    thread the timer builds it while this waits (InterruptedError if `cancelled()` turns true first).
    Raises SplatwrightError where it could not be built (in time)."""
    if threading.current_thread() is not threading.main_thread():
        return _waited(key, cancelled)
    inverse = _found(key, want=False)
    if inverse is None:
        steps = _sampling_steps(key)
        try:
            while True:
                next(steps)
        except StopIteration as done:
            inverse = invert(*done.value)
        except Exception as e:  # as in _step
            _keep(key, None, str(e))
            return _found(key, want=False)  # which says why
        _keep(key, inverse)
    return inverse


def _waited(key: tuple, cancelled) -> Inverse:
    waited = 0.0
    with _changed:
        while (inverse := _found(key, want=True)) is None:
            if cancelled():
                raise InterruptedError("render cancelled")
            if waited >= RENDER_WAIT:
                raise SplatwrightError("the view transform's colours were not sampled within "
                                       f"{RENDER_WAIT:.0f} s; render again, or use the Standard view transform")
            _changed.wait(0.1)
            waited += 0.1
    return inverse


def _step() -> float:
    """Timer: sample the transform of the newest view key asked for, one part per tick, then hand the
    samples to the inverting thread; redraw the viewports when an inverse got ready."""
    global _sampling, _news
    if _news:
        _news = False
        live.redraw({"VIEW_3D"})
    if _sampling is None:
        with _changed:
            if not _wanted:
                return IDLE_INTERVAL
            # The newest: what the viewports show now, or what a render waits for (which asks again).
            key = _wanted.pop()
            _wanted.clear()
            _inverting.add(key)
        _sampling = (key, _sampling_steps(key))
    key, steps = _sampling
    try:
        next(steps)
    except StopIteration as done:
        _sampling = None
        _jobs.put((key, *done.value))
    except Exception as e:  # a setting this Blender cannot copy, a file that cannot be written
        _sampling = None
        traceback.print_exc()
        _keep(key, None, str(e))
    return 0.0


def _invert_jobs() -> None:
    while (job := _jobs.get()) is not None:
        key, shaper, grid_display = job
        try:
            _keep(key, invert(shaper, grid_display))
        except Exception as e:  # a bug: say so where the inverse is wanted
            traceback.print_exc()
            _keep(key, None, str(e))


def _stop_inverting() -> None:
    """At unregister or exit: end the inverting thread (one still running at exit hangs Blender's)."""
    global _inverter
    if _inverter is not None:
        _jobs.put(None)
        _inverter.join(timeout=1.0)
        _inverter = None


def register():
    global _inverter
    _inverter = threading.Thread(target=_invert_jobs, name="splatwright-view-colors", daemon=True)
    _inverter.start()
    bpy.app.timers.register(_step, first_interval=IDLE_INTERVAL, persistent=True)
    bpy.app.handlers.save_pre.append(_remove_sampling_scene)
    atexit.register(_stop_inverting)


def unregister():
    global _sampling
    if bpy.app.timers.is_registered(_step):
        bpy.app.timers.unregister(_step)
    bpy.app.handlers.save_pre.remove(_remove_sampling_scene)
    _remove_sampling_scene()
    if _sampling is not None:
        _sampling[1].close()
        _sampling = None
    atexit.unregister(_stop_inverting)
    _stop_inverting()
    with _changed:
        _inverses.clear()
        _failures.clear()
        _wanted.clear()
        _inverting.clear()

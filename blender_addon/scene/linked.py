"""Native splat objects whose model is kept in a file outside the .blend (native.link_file): the .blend keeps the
file's path, relative to the .blend's folder where it is saved (so a project folder can move), and Blender's
Geometry Nodes import the file at each evaluation. Such an object is frozen to its file: it does not follow
training. Keep Outside .blend writes an object's model to its file on a thread of its own, then links the object;
a timer has an object whose file changed or went missing evaluated again, and reports a missing file once (the
object then shows nothing)."""
from __future__ import annotations

import os
import threading

import bpy

from ..core.files import write_atomic
from ..core.splats import encode_ply_bytes
from ..logic.native import from_attributes
from . import live, native
from .splats import SESSION_KEY

WATCH_SECONDS = 1.0  # between looks for linked files gone missing
POLL_SECONDS = 0.1  # between looks at a file being written

_seen: dict = {}  # (object name, path) -> its file's modification time last seen, None while missing (reported)
_writing: dict = {}  # object name -> the timer that links it once its file is written


def stored_path(path: str) -> str:
    """Absolute file path `path` as a linked object keeps it: relative to the .blend's folder (`//...`) where
    the .blend is saved and the two share a drive, else absolute."""
    if bpy.data.filepath:
        try:
            return bpy.path.relpath(path)
        except ValueError:  # another drive (Windows)
            pass
    return path


def file_of(obj) -> str:
    """The absolute path of the file linked object `obj` shows."""
    return os.path.normpath(bpy.path.abspath(native.linked_path(obj), library=obj.library))


def state(obj) -> str:
    """What the Model panel says of native splat object `obj` kept in a file, or '' where it holds its model."""
    path = native.linked_path(obj)
    if not path:
        return ""
    if not os.path.isfile(file_of(obj)):
        return (f"{path} is missing: {obj.name} shows nothing. Put the file back, or set the Path of its "
                f"{native.FILE_MODIFIER} modifier")
    if obj.get(SESSION_KEY):
        return f"kept in {path}: frozen to the file, it does not follow training; Store in .blend to follow it again"
    return f"shows {path}, kept outside the .blend"


def writing(obj) -> bool:
    """Whether Keep Outside .blend is writing `obj`'s file."""
    return obj.name in _writing


def keep_outside(obj, path: str) -> None:
    """Write native splat object `obj`'s model (the points its own cloud holds, in its own space) to `path`
    (absolute) as a 3DGS PLY, on a thread; once written, the object shows that file (kept as stored_path gives)
    and its own cloud is emptied. Blender's reports say when it is done, or why it failed."""
    model = from_attributes(native.read(obj.data))  # on the main thread: only bpy reads them
    name, uid, done, failed = obj.name, obj.session_uid, threading.Event(), []

    def write():
        try:
            write_atomic(path, encode_ply_bytes(model))
        except OSError as e:
            failed.append(e)
        finally:
            done.set()

    def finish():
        if _writing.get(name) is not finish:  # done already
            return None
        if not done.is_set():
            return POLL_SECONDS
        del _writing[name]
        target = bpy.data.objects.get(name)
        if target is not None and target.session_uid != uid:  # another .blend was opened meanwhile
            target = None
        if failed:
            live.report("ERROR", f"{name} stays in the .blend: writing {path} failed ({failed[0]}); choose a "
                        "folder you may write to")
        elif target is not None:
            native.link_file(target, stored_path(path))
            live.report("INFO", f"{name} is kept in {path} ({len(model):,} splats), outside the .blend, which "
                        "keeps only the path; it no longer follows training (Store in .blend to follow it again)")
        live.redraw()
        return None
    _writing[name] = finish
    threading.Thread(target=write, name="splatwright-keep-outside", daemon=True).start()
    bpy.app.timers.register(finish, first_interval=POLL_SECONDS, persistent=True)


def watch() -> float:
    """The timer: a linked object whose file went missing, came back or changed is evaluated again (so it shows
    nothing, or the file as it is now), and a missing file is reported once (again after it came back and went)."""
    for obj in bpy.data.objects:
        if obj.type != "POINTCLOUD" or not (path := native.linked_path(obj)):
            continue
        key = (obj.name, path)
        try:
            changed = os.stat(file_of(obj)).st_mtime_ns
        except OSError:
            changed = None
        if key in _seen and _seen[key] == changed:
            continue
        if key in _seen or changed is None:
            obj.update_tag()
        if changed is None:
            live.report("WARNING", f"{obj.name} shows nothing: its splats' file {file_of(obj)} is missing. Put the "
                        f"file back, or set the Path of its {native.FILE_MODIFIER} modifier")
        _seen[key] = changed
    return WATCH_SECONDS


def register():
    bpy.app.timers.register(watch, first_interval=WATCH_SECONDS, persistent=True)


def unregister():
    for timer in [watch, *_writing.values()]:
        if bpy.app.timers.is_registered(timer):
            bpy.app.timers.unregister(timer)
    _writing.clear()
    _seen.clear()

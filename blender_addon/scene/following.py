"""Native splat objects follow their session's model: while the session is open, a timer asks the backend for
the model whenever its training step moved on (as often as logic/native.refresh_interval says; a remote backend's
refreshes report their size and time), and writes it into each
object of that session, one attribute a timer tick, so that no tick holds Blender's main thread long. Each object
keeps a fingerprint of the points written into it, which tells where a user edited it since (edited_object)."""
from __future__ import annotations

import time

import bpy

from ..core.client import RemoteError
from ..core.errors import SplatwrightError
from ..core.splats import read_motion_ply_bytes
from ..logic.native import POSITION, fingerprint, native_attributes, refresh_interval
from . import live, native
from .session import nothing_to_show
from .splats import CENTRE_KEY, FINGERPRINT_KEY, SESSION_KEY, STEP_KEY, active_model, splat_objects

REFRESH = "native_refresh"  # the worker job that fetches the model
IDLE_SECONDS = 0.25  # between looks while nothing is to be written

_writes: list = []  # (object name, writing() steps, step, fingerprint of the positions written) still under way
_last_refresh = 0.0
_failed: set = set()  # (session, step) whose model could not be fetched: not asked for again, reported once


def native_objects() -> list:
    """Every native splat object of the open file that holds a session's model in its own point cloud (one kept
    in a file outside the .blend is frozen to the file: scene/linked.py)."""
    return [o for o in bpy.data.objects if SESSION_KEY in o and o.type == "POINTCLOUD" and not native.linked_path(o)]


def follow() -> float:
    """The timer: advance a write by one attribute, or start a refresh where a model moved on."""
    global _last_refresh
    if _writes:
        name, steps, step, written_positions = _writes[0]
        obj = bpy.data.objects.get(name)
        try:
            if obj is None or next(steps, StopIteration) is StopIteration:
                _writes.pop(0)
                if obj is not None:
                    obj[STEP_KEY], obj[FINGERPRINT_KEY] = step, written_positions
        except (ReferenceError, RuntimeError):  # the object or its data went away meanwhile
            _writes.pop(0)
        return 0.0
    b = live.backend
    session, step = b.status.get("session"), b.status.get("step")
    stale = [o for o in native_objects() if o[SESSION_KEY] == session and o.get(STEP_KEY) != step]
    stale = [] if (session, step) in _failed else stale
    interval = refresh_interval(b.remote, b.status.get("state"))
    if not stale or nothing_to_show() or REFRESH in b.in_flight or time.monotonic() - _last_refresh < interval:
        return IDLE_SECONDS
    _last_refresh = time.monotonic()
    centres = {o.name: tuple(o[CENTRE_KEY]) for o in stale}

    def fetch(client):  # on the worker: the model, and each object's attributes of it with their fingerprint
        start = time.monotonic()
        try:
            reply = client.request("export_ply", {"motion": True})
            model, motion = read_motion_ply_bytes(reply.payload, f"the model of session {session}")
        except (RemoteError, SplatwrightError) as e:
            return e
        fetched_in = time.monotonic() - start
        attributes = {name: native_attributes(model, motion, centre) for name, centre in centres.items()}
        return reply.fields["step"], len(reply.payload), fetched_in, {
            name: (values, fingerprint(values[POSITION])) for name, values in attributes.items()}

    def fetched(result) -> str:
        if isinstance(result, Exception):  # said once; the objects keep the model they hold
            _failed.add((session, step))
            live.report("WARNING", f"the splat objects of session {session} keep their model: {result}")
            return ""
        fetched_step, size, seconds, attributes = result
        if b.remote:
            live.report("INFO", f"the splat objects of session {session} take its model at step {fetched_step}: "
                        f"{size / 1e6:.1f} MB from the backend in {seconds:.1f} s")
        for name, (values, written_positions) in attributes.items():
            obj = bpy.data.objects.get(name)
            if obj is not None:
                _writes.append((name, written(obj, values), fetched_step, written_positions))
        return ""
    b.call(REFRESH, fetch, fetched)
    return IDLE_SECONDS


def edited_object(context, session: str):
    """The static native splat object of session `session` in the scene whose points, as Blender evaluates them,
    differ from the model last written into it (FINGERPRINT_KEY): points deleted or moved in Edit Mode, cropped by
    its crop box, changed by a modifier. An object that a refresh is writing is not edited, only half written.
    None where none is; where several are, the active one, and without one of them active SplatwrightError saying
    to choose."""
    depsgraph, writing = context.evaluated_depsgraph_get(), {name for name, *_ in _writes}
    edited = [o for o in splat_objects(context.scene)
              if o.type == "POINTCLOUD" and o[SESSION_KEY] == session and FINGERPRINT_KEY in o
              and o.name not in writing and not native.moving(o.data)
              and fingerprint(native.positions(o.evaluated_get(depsgraph).data)) != o[FINGERPRINT_KEY]]
    if len(edited) > 1:
        active = active_model(context)
        if active not in edited:
            raise SplatwrightError(f"{', '.join(o.name for o in edited)} all hold edits of session {session}'s "
                                   "model; select the one to continue training from")
        return active
    return edited[0] if edited else None


def written(obj, attributes):
    """native.writing's steps, then one that makes a 4D model's object move at the scene's time (or a model that
    became static stand still). A model of another point count goes into a new cloud, which replaces the object's
    (for every user of it, with its materials) once whole: resizing a cloud that holds a model copies each of
    its attributes (128 ms for 1M Gaussians of SH degree 3), resizing an empty one only its positions."""
    cloud = obj.data
    if len(cloud.points) == len(attributes[POSITION]):
        yield from native.writing(cloud, attributes)
    else:
        fresh = bpy.data.pointclouds.new(cloud.name)
        try:
            yield from native.writing(fresh, attributes)
            yield
            for material in cloud.materials:
                fresh.materials.append(material)
            name = cloud.name
            cloud.user_remap(fresh)
            bpy.data.pointclouds.remove(cloud)
            fresh.name = name
        finally:  # the write was given up (the object went away): the new cloud goes too
            try:
                if fresh.users == 0:
                    bpy.data.pointclouds.remove(fresh)
            except ReferenceError:
                pass
    yield
    if native.moving(obj.data):
        native.animate(obj, next(iter(obj.users_scene), bpy.context.scene))
    elif native.motion_modifier(obj) is not None:
        obj.modifiers.remove(native.motion_modifier(obj))


def register():
    bpy.app.timers.register(follow, first_interval=IDLE_SECONDS, persistent=True)


def unregister():
    if bpy.app.timers.is_registered(follow):
        bpy.app.timers.unregister(follow)
    _writes.clear()

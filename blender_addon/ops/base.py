"""What every operator module shares: an operator's poll() explains itself through blocked(), whose reason the
panels show as the button's hint; button() makes the common one-action operator; add_model_to_scene() puts a
session's model in the scene (Add Model to Scene, and Import Splats where Blender draws splats); connect() starts
or reaches the backend and start_training() starts training (the Backend and Training operators, and Capture &
Train, which does both by itself)."""
from __future__ import annotations

from typing import Callable

import bpy
from bpy.types import Context, Operator

from pathlib import Path

from ..core.errors import SplatwrightError
from ..core.points import POINTS_FILE
from ..core.splats import encode_ply_bytes, read_motion_ply_bytes, read_ply_bytes
from ..logic.dataset import training_views
from ..logic.defaults import training_seconds
from ..logic.native import POSITION, fingerprint, from_attributes, native_attributes
from ..logic.placement import model_bounds
from ..logic.training import training_fields
from ..render import composite
from ..scene import live, native
from ..scene.addon import prefs
from ..scene.colmap import imported_model, session_name, training_photos, world_points
from ..scene.reading import capture_size
from ..scene.session import cannot_send, has_model, send_to_session, set_status
from ..scene.following import edited_object
from ..scene.splats import CENTRE_KEY, FINGERPRINT_KEY, SESSION_KEY, add_model_object, add_native_object, splat_objects


class Guarded:
    @classmethod
    def blocked(cls, context) -> str:
        return ""

    @classmethod
    def poll(cls, context):
        reason = cls.blocked(context)
        if reason:
            cls.poll_message_set(reason)
        return not reason


def button(name: str, label: str, description: str, blocked: Callable[[Context], str],
           run: Callable[[Context], object]) -> type:
    """An operator that does one thing, run(context), when blocked(context) gives no reason against it (the
    reason is the button's hint): the shape of most of the sidebar's buttons."""
    def execute(self, context):
        run(context)
        return {"FINISHED"}
    return type(f"SPLATWRIGHT_OT_{name}", (Guarded, Operator), {
        "__doc__": description, "bl_idname": f"splatwright.{name}", "bl_label": label,
        "blocked": classmethod(lambda cls, context: blocked(context)), "execute": execute})


def add_model_to_scene(context, session: str, done: str = "") -> None:
    """Put the backend's model of the open session `session` in the scene: as Blender's own splats where Blender
    draws them (5.3 and later), else as an Empty whose splats final renders composite; `done` starts the report."""
    scene, view_layer, collection, natively = context.scene, context.view_layer, context.collection, native.available()

    def fetch(client):  # on the worker: the model, its box, and its attributes where Blender draws splats (a 4D
        # model's with its motion)
        if not natively:
            reply = client.request("export_ply")
            model = read_ply_bytes(reply.payload, f"the model of session {session}")
            return (*model_bounds(model.means), None, reply.fields["step"])
        reply = client.request("export_ply", {"motion": True})
        model, motion = read_motion_ply_bytes(reply.payload, f"the model of session {session}")
        return (*model_bounds(model.means), native_attributes(model, motion), reply.fields["step"])

    def add(result) -> str:
        centre, half_size, attributes, step = result
        placed = [o.name for o in splat_objects(scene) if o[SESSION_KEY] == session]
        if natively:
            obj = add_native_object(view_layer, collection, session, attributes, step)
            if native.moving(obj.data):
                native.animate(obj, scene)
        else:
            obj = add_model_object(view_layer, collection, session, centre, half_size)
            composite.prepare(scene)
        again = (f", which the scene already held as {', '.join(placed)} (delete {obj.name} if one copy is "
                 "enough)") if placed else ""
        if natively:
            moves = " at each frame's time, its frame range spanning the 4D model's times" if native.moving(obj.data) else ""
            return (f"{done}added {obj.name}, the model of session {session}{again}, as Blender's own splats: EEVEE "
                    f"and Cycles draw it with the scene{moves}")
        return (f"{done}added {obj.name}, the model of session {session}{again}; final renders composite it "
                "through the scene's compositor")
    live.backend.call("add_model", fetch, add)


def connect(context) -> None:
    """Start or reach the backend; one that has no session open reopens the scene's (after a crash, say)."""
    live.backend.connect(prefs(context).connect_settings(), reopen=context.scene.splatwright.session)


def start_training(context, fresh: bool) -> None:
    """Train the open session with the scene's settings: from scratch (`fresh`) or on from its model, which is what
    the session's native splat object shows where it was edited in Blender (points deleted, moved or cropped:
    following.edited_object), sent in the session's model space. The time left starts at the device's
    estimate per step and follows the measured steps from there. SplatwrightError where the edited object cannot
    be trained from."""
    scene = context.scene
    fields = training_fields(scene.splatwright, fresh=fresh, native_splats=native.available())
    edited = None
    if not fresh and native.available() and has_model():
        edited = edited_object(context, live.backend.status["session"])
    if edited is not None:
        attributes = native.shown_attributes(context, edited)  # on the main thread: only bpy reads them
        if not len(attributes[POSITION]):
            raise SplatwrightError(f"{edited.name} shows no splats to continue training from; undo the deletion or "
                                   "move its crop box, or start over")
    width, height = capture_size(scene)
    live.backend.clock.reset(training_seconds(live.backend.capabilities.get("device"), 1, width, height))
    live.backend.progress = {}
    if edited is None:
        live.backend.call("start_training", lambda c: c.call("start_training", **fields), training_started)
        return
    name, centre = edited.name, tuple(edited[CENTRE_KEY])

    def start(client):  # on the worker: its points are relative to the model's point at its origin, the centre
        model = encode_ply_bytes(from_attributes(attributes, centre))
        return client.request("start_training", fields, model).fields, fingerprint(attributes[POSITION])

    def started(result) -> str:
        reply, shown = result
        obj = bpy.data.objects.get(name)
        if obj is not None:
            obj[FINGERPRINT_KEY] = shown  # what it shows is what training continues from: not an edit any more
        return training_started(reply, f"the edited object {name} ({len(attributes[POSITION]):,} points)")
    live.backend.call("start_training", start, started)


def training_started(reply: dict, source: str = "") -> str:
    """The report of start_training's `reply`; `source`: the model sent to continue from, which it names."""
    status = {k: v for k, v in reply.items() if k != "continued"}
    set_status(status)
    how = f"continues from {source}" if source else \
        f"continues from step {status['step']}" if reply["continued"] else "starts from scratch"
    return f"training {how} in session {status['session']}"


PHOTOS = "PHOTOS"  # the Views choice that sends a COLMAP import's photos instead of capturing


def cannot_send_views(context) -> str:
    """Why Send to Backend cannot send now, or ''."""
    if reason := cannot_send():
        return reason
    if context.scene.splatwright.source == PHOTOS:
        return "" if imported_model(context) is not None else "Import COLMAP photos, then select their Empty"
    return "" if context.scene.splatwright.capture_folder else "Capture views first"


def send_views(context) -> str:
    """Send what the scene trains on to the backend: the selected COLMAP import's training photos (every 8th by
    name held out, at most Longest Side pixels) with their points where From is Photos, else the last
    capture's training views and its initial points; what the backend has already is not sent again. The
    session opened; '' where it is sent, else why not."""
    s = context.scene.splatwright
    try:
        if s.source == PHOTOS:
            empty = imported_model(context)
            photos, points = training_photos(empty, s.max_side), world_points(empty)
            if not photos:
                return f"{empty.name} has no training photos left; import the model again"
            send_to_session(context, "send_photos", session_name(empty), photos, points, f"photos of {empty.name}")
            return ""
        folder = Path(s.capture_folder)
        views = training_views(folder)
    except SplatwrightError as e:
        return str(e)
    points = folder / POINTS_FILE
    send_to_session(context, "send_views", folder.name,  # a capture's session is named after its folder
                    views, points if points.is_file() else None, "views")
    return ""

"""What every operator module shares: an operator's poll() explains itself through blocked(), whose reason the
panels show as the button's hint; button() makes the common one-action operator; add_model_to_scene() puts a
session's model in the scene (Add Model to Scene, and Import Splats where Blender draws splats)."""
from __future__ import annotations

from typing import Callable

from bpy.types import Context, Operator

from ..core.splats import read_motion_ply_bytes, read_ply_bytes
from ..logic.native import native_attributes
from ..logic.placement import model_bounds
from ..render import composite
from ..scene import live, native
from ..scene.splats import SESSION_KEY, add_model_object, add_native_object, splat_objects

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

"""What every operator module shares: an operator's poll() explains itself through blocked(), whose reason the
panels show as the button's hint, and button() makes the common one-action operator."""
from __future__ import annotations

from typing import Callable

from bpy.types import Context, Operator

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


"""The Blender side of `python -m backend bench follow` (follow.py), in a bpy 5.3 process with the checkout on
PYTHONPATH: a native splat object of a session follows its model as scene/following.py makes it, the backend a
stand-in (the add-on's own Backend and worker thread, its client answering export_ply with the PLY files given,
one a training step). The main thread runs what Blender's timers would: following.follow and the backend's drain
(live.poll's), each timed, and after each the depsgraph evaluation a redraw would make (timed apart); it waits
between ticks as follow asks (at most IDLE_WAIT, so that more ticks meet the worker's PLY parsing). Prints
`RESULT <json>`.

    PYTHONPATH=. python backend/tools/bench/blender_follow.py STEP1.ply [STEP2.ply ...]
"""
from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import bpy

from blender_addon.logic.native import POSITION
from blender_addon.logic.runtime import Backend
from blender_addon.scene import following, live, native
from blender_addon.scene.splats import CENTRE_KEY, SESSION_KEY, STEP_KEY

SESSION = "bench"
IDLE_WAIT = 0.02  # seconds, at most, between ticks


class StandIn:
    """The backend's client: export_ply gives the PLY file of the step the status says."""

    def __init__(self, paths: list[str]):
        self.models = [open(path, "rb").read() for path in paths]
        self.step = 1

    def request(self, kind: str, fields: dict):
        assert kind == "export_ply", kind
        return SimpleNamespace(payload=self.models[self.step - 1], fields={"step": self.step})

    def close(self):
        pass


def main(paths: list[str]) -> None:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    cloud = bpy.data.pointclouds.new("model")
    cloud.type = native.NATIVE_TYPE
    obj = bpy.data.objects.new("model", cloud)
    obj[SESSION_KEY], obj[CENTRE_KEY] = SESSION, (0.0, 0.0, 0.0)
    bpy.context.scene.collection.objects.link(obj)
    client = StandIn(paths)
    b = live.backend = Backend()
    b._client, b.connection = client, "connected"

    what = [""]  # what the tick being timed does
    plain = native.writing

    def labelled(cloud, attributes):  # native.writing, saying which step a tick runs
        what[0] = f"resize {len(cloud.points)} -> {len(attributes[POSITION])}" \
            if len(cloud.points) != len(attributes[POSITION]) else "setup (no resize)"
        steps = plain(cloud, attributes)
        next(steps)
        for name in attributes:
            yield
            what[0] = f"write {name}"
            next(steps, None)
    native.writing = labelled

    ticks, refreshes = [], []
    for step in range(1, len(paths) + 1):
        client.step = step
        b.status = {"session": SESSION, "step": step, "gaussians": 1}
        following._last_refresh = 0.0  # no wait of REFRESH_SECONDS between the refreshes
        start = time.perf_counter()
        while obj.get(STEP_KEY) != step:
            t = time.perf_counter()
            changed, _ = b.drain()
            if changed:
                ticks.append({"step": step, "tick": "drain", "ms": 1000 * (time.perf_counter() - t)})
            what[0] = "look" if not following._writes else "finish"
            t = time.perf_counter()
            interval = following.follow()
            ms = 1000 * (time.perf_counter() - t)
            t = time.perf_counter()
            bpy.context.evaluated_depsgraph_get()  # what the redraw after the tick evaluates
            ticks.append({"step": step, "tick": what[0], "ms": ms, "evaluation_ms": 1000 * (time.perf_counter() - t)})
            time.sleep(min(interval, IDLE_WAIT))
        refreshes.append({"step": step, "points": len(obj.data.points), "seconds": time.perf_counter() - start})
    b.close()
    print("RESULT " + json.dumps({"blender": bpy.app.version_string, "ticks": ticks, "refreshes": refreshes}))


if __name__ == "__main__":
    main(sys.argv[1:])

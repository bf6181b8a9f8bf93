"""Timeline scrubbing benchmark: from a frame change (a new time of a 4D model) to the new time's frame ready
for the GPU texture upload, through the add-on's own client code (frames.FrameStream, as the viewport
composite uses it: the time in its model_choice, frames with their depth plane packed by the backend) from the
real server on loopback, frames in shared memory (through the socket with --socket-frames). The camera
stays put and each request is the next frame of a 24 fps, 10-second timeline (wrapping), as playback or
scrubbing asks; each is timed until the frame tagged with its time is ready. p50/p95 with training paused and
while training, and the main thread's own share (setting the time and ask()).

The session's views carry evenly spaced times, so the backend trains a 4D model (backend.dynamic) and draws
every frame of the model at the request's time. Default size: 1M Gaussians at 1920x1080 on a GPU, 2000
Gaussians at 64x48 on the CPU reference rasterizer. `--out DIR` also writes scrub-<date>-<device>.json.
"""
from __future__ import annotations

import argparse
import time

from blender_addon.core.client import Client
from blender_addon.logic.dataset import frame_time
from blender_addon.logic.frames import Frame
from .serve import SESSION, LiveBench, add_live_arguments, orbit_camera
from .viewport import Latency, paused_and_training, report

FPS, TIMELINE_SECONDS = 24, 10
TIMELINE_FRAMES = FPS * TIMELINE_SECONDS  # frames 1 to 240, as a Blender scene's frame range has them


def timeline_time(n: int) -> float:
    """The time of the n-th frame stepped to (wrapping at the timeline's end), as scene_splats.scene_time
    gives it for the scene's current frame."""
    return frame_time(1 + n % TIMELINE_FRAMES, 1, TIMELINE_FRAMES)


class Scrub(Latency):
    """Steps a FrameStream's time one timeline frame per request, the camera fixed, and times each request
    until the frame of its time is ready."""

    def __init__(self, client: Client, model: str | None = SESSION, depth: bool = True):
        super().__init__(client)
        self.model = model
        self.stream.depth = depth
        self.received: list[tuple[int, float]] = []  # the tag of every frame that arrived: (request, time)

    def _arrived(self, frame: Frame) -> None:
        self.received.append(frame.tag)
        super()._arrived(frame)

    def measure(self, width: int, height: int, seconds: float) -> list[float]:
        """Milliseconds per frame change, for `seconds`."""
        camera = orbit_camera(0.3, width, height)
        times, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.asked += 1
            t = timeline_time(self.asked)
            self.stream.model_choice = {"model": self.model, "crop": None, "time": t}
            times.append(self.timed(camera, (self.asked, t)))  # as the live view's, the tag says the time
        return times


def measure(client: Client, bench: LiveBench, depth: bool = True) -> tuple[Scrub, list[float], list[float]]:
    """The scrub, and its milliseconds per frame change with training paused and while training (left
    training after)."""
    scrub = Scrub(client, depth=depth)
    return (scrub, *paused_and_training(scrub, client, bench))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench scrub", description=__doc__.split("\n")[0])
    add_live_arguments(p)
    p.add_argument("--no-depth", dest="depth", action="store_false",
                   help="frames without the depth plane the viewport composite asks for")
    args = p.parse_args(argv)
    bench = LiveBench.from_args("scrub", args)
    with bench.paused_training(dynamic=True) as client:
        scrub, idle, training = measure(client, bench, args.depth)
        frame_format = scrub.frame.fields["format"]
    what = "frame" if args.depth else "frame (no depth)"
    idle_ms, training_ms, ask = report(f"time change -> {what} ready for upload", idle, training, scrub.ask_ms,
                                       "time change and ask()")
    bench.result(frame_format=frame_format, depth=args.depth,
                 timeline={"fps": FPS, "seconds": TIMELINE_SECONDS, "frames": TIMELINE_FRAMES},
                 time_to_upload_ready_idle=idle_ms, time_to_upload_ready_training=training_ms,
                 main_thread_ask=ask)
    return 0

"""Viewport latency benchmark: from a camera change to the new frame ready for the GPU texture upload (the
float buffer the texture takes: made on the device and read in its shared-memory slot, or converted from the
rgba8 bytes received through the socket), through the add-on's own client code (frames.FrameStream, as the
render engine uses it) from the real server on loopback, frames in shared memory (through the socket with
--socket-frames). p50/p95 with training paused and while training, and the main
thread's own share: how long the view's ask() takes (a redraw's only call into the stream; the tests check
that it never waits, this measures it).

Default size: 1M Gaussians at 1920x1080 on a GPU, 2000 Gaussians at 64x48 on the CPU reference rasterizer.
`--out DIR` also writes viewport-<date>-<device>.json.
"""
from __future__ import annotations

import argparse
import threading
import time

import numpy as np

from blender_addon.core.client import Client
from blender_addon.logic.frames import Frame, FrameStream
from .serve import LiveBench, add_live_arguments, orbit_camera, percentiles

FRAME_TIMEOUT = 120.0


class Latency:
    """Asks a FrameStream for one view after another and times each until its frame is ready."""

    def __init__(self, client: Client):
        self.ready = threading.Condition()
        self.frame: Frame | None = None
        self.stream = FrameStream(lambda: client, on_frame=self._arrived)
        self.asked = 0
        self.ask_ms: list[float] = []  # main-thread milliseconds of each ask()

    def _arrived(self, frame: Frame) -> None:
        with self.ready:
            self.frame = frame
            self.ready.notify_all()

    def timed(self, camera, tag) -> float:
        """Milliseconds from asking for `camera`'s frame (tagged `tag`) to its being ready."""
        start = time.perf_counter()
        self.stream.ask(camera, tag)
        self.ask_ms.append(1000 * (time.perf_counter() - start))
        with self.ready:
            if not self.ready.wait_for(lambda: self.frame is not None and self.frame.tag == tag, FRAME_TIMEOUT):
                raise TimeoutError(f"no frame within {FRAME_TIMEOUT} s: {self.stream.error or 'no error'}")
        return 1000 * (time.perf_counter() - start)

    def measure(self, width: int, height: int, seconds: float) -> list[float]:
        """Milliseconds per camera change, the camera orbiting a little each time, for `seconds`."""
        times, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.asked += 1
            times.append(self.timed(orbit_camera(0.3 + 0.01 * self.asked, width, height), self.asked))
        return times


def paused_and_training(latency: Latency, client: Client, bench) -> tuple[list[float], list[float]]:
    """Milliseconds per request of `latency` with training paused, then while training (left training), each
    after a warm-up; the stream is closed after."""
    warm_up = min(1.0, bench.seconds)
    latency.measure(bench.width, bench.height, warm_up)
    idle = latency.measure(bench.width, bench.height, bench.seconds)
    client.call("resume")
    latency.measure(bench.width, bench.height, warm_up)
    training = latency.measure(bench.width, bench.height, bench.seconds)
    latency.stream.close()
    return idle, training


def report(what: str, idle: list[float], training: list[float], ask_ms: list[float],
           asking: str) -> tuple[dict, dict, dict]:
    """Print and return the percentiles of `what` paused and while training, and of the main thread's `asking`."""
    idle_ms, training_ms = percentiles(idle), percentiles(training)
    for label, r in (("paused", idle_ms), ("training", training_ms)):
        print(f"{what}, {label + ':':9s} p50 {r['p50_ms']:8.2f} ms  p95 {r['p95_ms']:8.2f} ms  ({r['frames']} frames)")
    ask = {"p50_ms": round(float(np.percentile(ask_ms, 50)), 4), "p99_ms": round(float(np.percentile(ask_ms, 99)), 4),
           "max_ms": round(max(ask_ms), 4)}
    print(f"main thread per {asking}: p50 {ask['p50_ms']:8.4f} ms  p99 {ask['p99_ms']:8.4f} ms  max {ask['max_ms']:.4f} ms")
    return idle_ms, training_ms, ask


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench viewport", description=__doc__.split("\n")[0])
    add_live_arguments(p)
    bench = LiveBench.from_args("viewport", p.parse_args(argv))
    with bench.paused_training() as client:
        latency = Latency(client)
        idle, training = paused_and_training(latency, client, bench)
        frame_format = latency.frame.fields["format"]
    idle_ms, training_ms, ask = report("camera change -> frame ready for upload", idle, training, latency.ask_ms,
                                       "ask()")
    bench.result(frame_format=frame_format, camera_to_upload_ready_idle=idle_ms,
                 camera_to_upload_ready_training=training_ms, main_thread_ask=ask)
    return 0

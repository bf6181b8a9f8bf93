"""Viewport latency benchmark: from a camera change to the new frame ready for the GPU texture upload (the
bytes received and turned into the float buffer the texture takes), through the add-on's own client code
(client.FrameStream, as the render engine uses it) on the real socket. p50/p95 with training paused and
while training.

Default size: 1M Gaussians at 1920x1080 on a GPU, 2000 Gaussians at 64x48 on the CPU reference rasterizer.
`--out DIR` also writes viewport-<date>-<device>.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import threading
import time
from pathlib import Path

import torch

from ..client import Client, Frame, FrameStream
from ..commands import device_name, resolve_device
from .raster import git_commit
from .serve import make_scene, orbit_camera, percentiles, start_backend, wire

FRAME_TIMEOUT = 120.0


class Latency:
    """Asks a FrameStream for one view after another and times each until its frame is ready."""

    def __init__(self, client: Client):
        self.ready = threading.Condition()
        self.frame: Frame | None = None
        self.stream = FrameStream(lambda: client, on_frame=self._arrived)
        self.asked = 0

    def _arrived(self, frame: Frame) -> None:
        with self.ready:
            self.frame = frame
            self.ready.notify_all()

    def measure(self, width: int, height: int, seconds: float) -> list[float]:
        """Milliseconds per camera change, the camera orbiting a little each time, for `seconds`."""
        times, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.asked += 1
            tag = self.asked
            start = time.perf_counter()
            self.stream.ask(wire(orbit_camera(0.3 + 0.01 * tag, width, height)), tag)
            with self.ready:
                if not self.ready.wait_for(lambda: self.frame is not None and self.frame.tag == tag, FRAME_TIMEOUT):
                    raise TimeoutError(f"no frame within {FRAME_TIMEOUT} s: {self.stream.error or 'no error'}")
            times.append(1000 * (time.perf_counter() - start))
        return times


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench viewport", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--gaussians", type=int, default=None, help="default: 1000000 on GPU, 2000 on CPU")
    p.add_argument("--width", type=int, default=None, help="default: 1920 on GPU, 64 on CPU")
    p.add_argument("--height", type=int, default=None, help="default: 1080 on GPU, 48 on CPU")
    p.add_argument("--views", type=int, default=8)
    p.add_argument("--seconds", type=float, default=None, help="per measurement (default: 10 on GPU, 3 on CPU)")
    p.add_argument("--out", type=Path, default=None, help="folder for a JSON result file")
    args = p.parse_args(argv)

    device, rasterizer = resolve_device(args.device)
    gpu = device == "cuda"
    n = args.gaussians or (1_000_000 if gpu else 2000)
    width, height = args.width or (1920 if gpu else 64), args.height or (1080 if gpu else 48)
    seconds = args.seconds or (10.0 if gpu else 3.0)
    print(f"bench viewport: {n:,} Gaussians at {width}x{height} on {device_name(device)}", flush=True)
    xyz, rgb, cameras, images = make_scene(n, args.views, width, height, device, rasterizer)
    if gpu:
        torch.cuda.empty_cache()  # leave the GPU to the server

    with tempfile.TemporaryDirectory() as workdir:
        proc, port = start_backend(workdir, device)
        try:
            with Client("127.0.0.1", port, timeout=600) as client:
                client.open_session("bench")
                for cam, image in zip(cameras, images):
                    client.add_view(wire(cam), image)
                client.set_points(xyz, rgb)
                client.start_training(iterations=10_000_000, sh_degree=0, max_gaussians=n, checkpoint_every=0)
                client.pause()
                latency = Latency(client)
                latency.measure(width, height, min(1.0, seconds))  # warm-up
                idle = latency.measure(width, height, seconds)
                client.resume()
                latency.measure(width, height, min(1.0, seconds))
                training = latency.measure(width, height, seconds)
                latency.stream.close()
                client.stop()
                client.shutdown()
        finally:
            if proc.poll() is None:
                proc.wait(30)

    now = datetime.datetime.now(datetime.timezone.utc)
    result = {"benchmark": "viewport", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "device": device_name(device),
              "commit": git_commit(), "torch": torch.__version__, "gaussians": n, "width": width, "height": height,
              "frame_format": client.frame_format, "camera_to_upload_ready_idle": percentiles(idle),
              "camera_to_upload_ready_training": percentiles(training)}
    for label, key in (("paused", "camera_to_upload_ready_idle"), ("training", "camera_to_upload_ready_training")):
        r = result[key]
        print(f"camera change -> frame ready for upload, {label + ':':9s} p50 {r['p50_ms']:8.2f} ms  "
              f"p95 {r['p95_ms']:8.2f} ms  ({r['frames']} frames)")
    print(json.dumps(result))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"viewport-{now.strftime('%Y%m%d-%H%M')}-{device}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    return 0

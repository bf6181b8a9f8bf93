"""Server latency benchmark: render round trips through the real server on loopback, frames in shared memory
(through the socket with --socket-frames, as from a backend on another machine, though raw), p50/p95 with
training paused and while training, and training throughput with and without a client asking for frames at
30 per second.

It starts `python -m backend serve` on loopback, uploads views of a random model rendered here, trains from
the model's points and measures from the client's side. Default size: 1M Gaussians at 1920x1080 on a GPU,
2000 Gaussians at 64x48 on the CPU reference rasterizer. `--out DIR` also writes serve-<date>-<device>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from blender_addon.core.client import Client
from blender_addon.logic.frames import training_frame_gap
from ...gaussians import Gaussians
from ...policy import device_name, resolve_device
from ...render import render
from . import ROOT, git_commit

SESSION = "bench"  # the session LiveBench.paused_training trains in


def orbit_camera(angle: float, width: int, height: int, radius: float = 3.0) -> Camera:
    eye = [radius * math.cos(angle), radius * math.sin(angle), 0.6 * radius]
    return Camera(look_at(eye, [0.0, 0.0, 0.0]), intrinsics_from_fov_x(0.8, width, height), width, height)


def make_scene(n: int, views: int, width: int, height: int, device: str, rasterizer: str, seed: int = 0):
    """Random points in the unit cube (xyz float32, rgb uint8) and RGB8 views of the model built from them,
    rows bottom-up as the wire wants them."""
    gen = torch.Generator().manual_seed(seed)
    xyz = (2 * torch.rand(n, 3, generator=gen) - 1).numpy()
    rgb = (torch.rand(n, 3, generator=gen) * 255).to(torch.uint8).numpy()
    g = Gaussians.from_point_cloud(xyz, rgb, 0, device)
    cameras = [orbit_camera(2 * math.pi * i / views, width, height) for i in range(views)]
    images = []
    with torch.no_grad():
        for cam in cameras:
            image = render(g, cam, 0, (1.0, 1.0, 1.0), rasterizer).image.clamp(0, 1)
            images.append((image * 255 + 0.5).to(torch.uint8).cpu().numpy()[::-1])
    return xyz, rgb, cameras, images


def start_backend(workdir: str, device: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "backend", "serve", "--port", "0", "--workdir", workdir,
                             "--device", device], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the backend exited with code {proc.wait()} before it was ready")
    return proc, json.loads(line)["port"]


def render_round_trips(client: Client, width: int, height: int, seconds: float, fps: float | None,
                       stop: threading.Event | None = None, throttled: bool = False) -> list[float]:
    """Milliseconds per frame, the camera orbiting a little each frame; `fps` paces the requests (None: back
    to back), the way a viewport asks for frames, or `throttled` as the add-on's live view does while a CPU
    backend trains (frames.training_frame_gap)."""
    times, deadline, i = [], time.monotonic() + seconds, 0
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        start = time.perf_counter()
        client.render(orbit_camera(0.3 + 0.01 * i, width, height))
        elapsed = time.perf_counter() - start
        times.append(1000 * elapsed)
        i += 1
        if throttled:
            time.sleep(training_frame_gap(elapsed))
        elif fps:
            time.sleep(max(0.0, 1 / fps - elapsed))
    return times


def training_rate(client: Client, seconds: float) -> float:
    """Training steps per second over `seconds`, read from the server's step count."""
    step0, t0 = client.call("status")["step"], time.monotonic()
    time.sleep(seconds)
    return (client.call("status")["step"] - step0) / (time.monotonic() - t0)


def percentiles(times: list[float]) -> dict:
    return {"p50_ms": round(float(np.percentile(times, 50)), 2), "p95_ms": round(float(np.percentile(times, 95)), 2),
            "frames": len(times)}


def add_live_arguments(p: argparse.ArgumentParser) -> None:
    """The options shared by the benchmarks that drive a live backend (serve, viewport)."""
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--gaussians", type=int, default=None, help="default: 1000000 on GPU, 2000 on CPU")
    p.add_argument("--width", type=int, default=None, help="default: 1920 on GPU, 64 on CPU")
    p.add_argument("--height", type=int, default=None, help="default: 1080 on GPU, 48 on CPU")
    p.add_argument("--views", type=int, default=8)
    p.add_argument("--seconds", type=float, default=None, help="per measurement (default: 10 on GPU, 3 on CPU)")
    p.add_argument("--out", type=Path, default=None, help="folder for a JSON result file")
    p.add_argument("--socket-frames", action="store_true", help="frames through the socket, as a backend on "
                   "another machine sends them (default: through shared memory where this system has it)")


@dataclass
class LiveBench:
    name: str
    device: str
    rasterizer: str
    gaussians: int
    width: int
    height: int
    seconds: float
    views: int
    out: Path | None
    shared_frames: bool = True  # asked for; once connected, whether the backend hands frames over in shared memory

    @classmethod
    def from_args(cls, name: str, args) -> "LiveBench":
        device, rasterizer = resolve_device(args.device)
        gpu = device == "cuda"
        bench = cls(name, device, rasterizer, args.gaussians or (1_000_000 if gpu else 2000),
                    args.width or (1920 if gpu else 64), args.height or (1080 if gpu else 48),
                    args.seconds or (10.0 if gpu else 3.0), args.views, args.out, not args.socket_frames)
        print(f"bench {name}: {bench.gaussians:,} Gaussians at {bench.width}x{bench.height} on "
              f"{device_name(device)}", flush=True)
        return bench

    @contextlib.contextmanager
    def paused_training(self, dynamic: bool = False) -> Iterator[Client]:
        """A backend on loopback with a training session (SESSION) on a random model of this size, paused; it
        trains at a fixed size (no growth, no checkpoints) so steps stay comparable. Stopped and shut down after.
        `dynamic`: the views carry evenly spaced times in [0, 1], so the session trains a 4D model."""
        xyz, rgb, cameras, images = make_scene(self.gaussians, self.views, self.width, self.height, self.device,
                                               self.rasterizer)
        times = [i / max(1, self.views - 1) if dynamic else None for i in range(self.views)]
        if self.device == "cuda":
            torch.cuda.empty_cache()  # leave the GPU to the server
        with tempfile.TemporaryDirectory() as workdir:
            proc, port = start_backend(workdir, self.device)
            try:
                with Client("127.0.0.1", port, timeout=600, shared_frames=self.shared_frames) as client:
                    self.shared_frames = client.shared is not None
                    client.call("open_session", name=SESSION)
                    for cam, image, t in zip(cameras, images, times):
                        client.add_view(cam, image, time=t)
                    client.set_points(xyz, rgb)
                    client.call("start_training", iterations=10_000_000, sh_degree=0, max_gaussians=self.gaussians,
                                          checkpoint_every=0, checkpoint_seconds=0)
                    while not client.call("status")["gaussians"]:  # the trainer is set up after the reply
                        time.sleep(0.05)
                    client.call("pause")
                    yield client
                    client.call("stop")
                    client.call("shutdown")
            except BaseException:
                proc.kill()  # a failed benchmark leaves no backend behind
                raise
            finally:
                proc.wait(30)

    def result(self, **measured) -> dict:
        """The result record, printed as JSON and written to --out when given."""
        now = datetime.datetime.now(datetime.timezone.utc)
        result = {"benchmark": self.name, "date": now.strftime("%Y-%m-%d %H:%M UTC"),
                  "device": device_name(self.device), "commit": git_commit(), "torch": torch.__version__,
                  "gaussians": self.gaussians, "width": self.width, "height": self.height,
                  "frames_through": "shared memory" if self.shared_frames else "socket", **measured}
        print(json.dumps(result))
        if self.out:
            self.out.mkdir(parents=True, exist_ok=True)
            path = self.out / f"{self.name}-{now.strftime('%Y%m%d-%H%M')}-{self.device}.json"
            path.write_text(json.dumps(result, indent=2) + "\n")
            print(f"wrote {path}")
        return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m backend bench serve", description=__doc__.split("\n")[0])
    add_live_arguments(p)
    p.add_argument("--fps", type=float, default=30.0, help="frame rate the client asks for while training")
    p.add_argument("--frame-size", type=int, nargs=2, metavar=("WIDTH", "HEIGHT"), default=None,
                   help="size of the frames the client asks for while training (default: the views' size)")
    p.add_argument("--throttled", action="store_true",
                   help="pace the client as the add-on's live view does while a CPU backend trains, not by --fps")
    args = p.parse_args(argv)
    bench = LiveBench.from_args("serve", args)
    width, height, seconds = bench.width, bench.height, bench.seconds
    frame_size = args.frame_size or (width, height)

    with bench.paused_training() as client:
        for _ in range(3):  # warm-up
            client.render(orbit_camera(0.3, width, height))
        idle = render_round_trips(client, width, height, seconds, fps=None)
        client.call("resume")
        training_rate(client, min(2.0, seconds))  # warm-up
        alone = training_rate(client, seconds)
        stop = threading.Event()
        frames: list[float] = []
        viewer = threading.Thread(target=lambda: frames.extend(
            render_round_trips(client, *frame_size, 3600, args.fps, stop, args.throttled)))
        viewer.start()
        with_client = training_rate(client, seconds)
        stop.set()
        viewer.join()

    idle_ms, training_ms = percentiles(idle), percentiles(frames)
    asked = "throttled" if args.throttled else f"{args.fps:g}"
    print(f"render round trip, paused:   p50 {idle_ms['p50_ms']:8.2f} ms  "
          f"p95 {idle_ms['p95_ms']:8.2f} ms  ({len(idle)} frames)")
    print(f"render round trip, training: p50 {training_ms['p50_ms']:8.2f} ms  "
          f"p95 {training_ms['p95_ms']:8.2f} ms  ({len(frames)} frames, "
          f"{len(frames) / seconds:.1f} fps, asked: {asked})")
    print(f"training: {alone:.2f} it/s alone, {with_client:.2f} it/s with the client "
          f"({100 * (1 - with_client / alone) if alone else 0:.0f}% slower)")
    bench.result(render_idle=idle_ms, render_while_training=training_ms,
                 train_its=round(alone, 2), train_its_with_client=round(with_client, 2),
                 client_fps_asked=asked, client_fps_got=round(len(frames) / seconds, 1), client_frame_size=frame_size)
    return 0

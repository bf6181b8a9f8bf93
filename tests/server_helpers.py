"""Talking to the backend in tests: the server as a subprocess on loopback, raw sockets, protocol round trips,
events, and a stand-in for the add-on's client."""
from __future__ import annotations

import contextlib
import io
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from blender_addon.core import codecs, protocol
from blender_addon.core.cameras import Camera
from blender_addon.core.client import Client, PendingReply, RemoteError
from blender_addon.core.protocol import REQUESTS, SERVER_MESSAGES, Message
from backend.render import render
from backend.service.engine import Engine
from backend.service.limits import Limits
from backend.service.server import Server
from helpers import ROOT

SIZE = 32  # the side of the views of conftest's scene


class ServerProcess:
    """`python -m backend serve` on loopback, its stderr in a log file next to the workdir."""

    def __init__(self, workdir: Path, *args: str, **popen):
        self.log_path = workdir.parent / f"{workdir.name}-server-{time.monotonic_ns()}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "backend", "serve", "--port", "0", "--workdir", str(workdir),
                 "--device", "cpu", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, **popen)
        line = self.proc.stdout.readline()
        assert line, f"server exited before its ready line:\n{self.log_path.read_text()}"
        ready = json.loads(line)
        assert ready["event"] == "ready" and ready["protocol"] == protocol.PROTOCOL_VERSION
        self.port = ready["port"]

    def client(self, token: str = "", **kwargs) -> Client:
        return Client("127.0.0.1", self.port, token, timeout=30, **kwargs)

    def rss(self, key: str = "VmRSS") -> int:
        """The server's resident memory in bytes (key "VmHWM": its peak so far)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(status.split(key + ":")[1].split()[0]) * 1024

    def log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.proc.stdout.close()


@contextlib.contextmanager
def serving(workdir: Path, device: str = "cpu", rasterizer: str = "reference", limits: Limits = Limits()):
    """A client of a server in this process (where a test can patch what it runs), stopped on leaving."""
    server = Server(Engine(workdir, device, rasterizer, limits))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Client("127.0.0.1", server.port) as client:
            yield client
    finally:
        server.stop()
        thread.join(30)


def process_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie waiting to be reaped (Linux)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def expected_frame(g, cam, sh_degree: int, background) -> np.ndarray:
    """What the server should send: RGBA8, rows bottom-up."""
    with torch.no_grad():
        out = render(g, cam, sh_degree, background)
    rgba = torch.cat([out.image, out.alpha[..., None]], dim=-1)
    return (rgba.clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()[::-1]


def wait_for(client: Client, predicate, timeout: float = 120.0) -> dict:
    """The first event `predicate` accepts; the timeout is generous for a loaded CI machine."""
    deadline = time.monotonic() + timeout
    for event in client.events(timeout=timeout):
        if predicate(event):
            return event
        assert time.monotonic() < deadline, "timed out waiting for an event"
    raise AssertionError("no matching event before the connection closed or went quiet")


def add_scene_views(client: Client, scene, count: int = 4) -> None:
    _, cameras, images = scene
    for cam, image in list(zip(cameras, images))[:count]:
        client.add_view(cam, png_bytes(image))


def raw_connect(port: int, hello: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if hello:
        protocol.send_message(sock, protocol.encode_message(
            REQUESTS, "hello", 1, {"token": "", "protocol": protocol.PROTOCOL_VERSION}))
        assert protocol.read_message(sock, SERVER_MESSAGES).type == "reply"
    return sock


def read_until_closed(sock: socket.socket) -> list:
    """Every message the server sends until it closes the connection."""
    messages = []
    while True:
        try:
            messages.append(protocol.read_message(sock, SERVER_MESSAGES))
        except protocol.ConnectionClosed:
            return messages


CAMERA = codecs.camera_to_wire(Camera(np.eye(4), np.array([[50.0, 0, 16], [0, 50.0, 16], [0, 0, 1]]), 32, 32))


def roundtrip(parts_or_bytes, specs=REQUESTS):
    """Send bytes through a socket pair and read one message back."""
    data = parts_or_bytes if isinstance(parts_or_bytes, bytes) else b"".join(bytes(p) for p in parts_or_bytes)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        return protocol.read_message(b, specs)


class FakeClient:
    """submit_render as the real Client has it: replies arrive later, on another thread; a borrowed one's frame
    is a view of shared memory, whose release is recorded."""
    frame_format = "rgba8"
    shared = None  # frames come as rgba8, as through the socket

    def __init__(self):
        self.asked: list[Camera] = []
        self.pending: list[PendingReply] = []
        self.released: list[int] = []  # the answers whose shared memory went back

    def submit_render(self, camera, format=None, depth=False, on_done=None, stream=0, borrow=False):
        self.asked.append(camera)
        pending = PendingReply("render", on_done, borrow)
        self.pending.append(pending)
        return pending

    def answer(self, index: int, value: int = 0, error: RemoteError | None = None):
        cam = self.asked[index]
        fields = {"width": cam.width, "height": cam.height, "format": "rgba8", "step": index, "sh_degree": 0,
                  "background": [1.0, 1.0, 1.0], "depth_offset": None}
        payload = np.full((cam.height, cam.width, 4), value, np.uint8).tobytes()
        if self.pending[index].borrow and error is None:
            payload = memoryview(payload)
            self.pending[index]._release = lambda: self.released.append(index)
        threading.Thread(target=self.pending[index]._finish,
                         args=(None if error else Message("reply", index + 1, fields, payload), error)).start()

"""A small blocking client for the Splatwright backend server.

Standard library + numpy only: this file is copied verbatim into the Blender add-on next to protocol.py.
One reader thread receives every frame: replies complete the request of their id, events go to a bounded
queue read by `events()`.
Requests may be sent from any thread. FrameStream serves a live view: newest camera wins, frames come back
ready for a GPU texture upload.
"""
from __future__ import annotations

import itertools
import queue
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import protocol
from .protocol import Message, ProtocolError, SERVER_MESSAGES

MAX_QUEUED_EVENTS = 1000


class RemoteError(Exception):
    """The server answered a request with an error."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} [{code}]")
        self.code, self.message = code, message


class PendingReply:
    """A request in flight; result() waits for its reply."""

    def __init__(self, type: str, on_done: Callable[["PendingReply"], None] | None = None):
        self.type = type
        self._on_done = on_done  # called once finished, on the thread that finishes it
        self._done = threading.Event()
        self._reply: Message | None = None
        self._error: Exception | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Message:
        if not self._done.wait(timeout):
            raise TimeoutError(f"no reply to {self.type} within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._reply

    def _finish(self, reply: Message | None = None, error: Exception | None = None) -> None:
        self._reply, self._error = reply, error
        self._done.set()
        if self._on_done is not None:
            self._on_done(self)


def wait_done(task: Future | PendingReply, label: str, timeout: float, cancelled: Callable[[], bool]):
    """The task's result once it is done, polled 10 times a second; InterruptedError once `cancelled()` says
    so, TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return task.result(0.1)
        except (FutureTimeout, TimeoutError):  # distinct classes before Python 3.11
            if task.done():  # the task itself failed with a timeout
                raise
            if cancelled():
                raise InterruptedError(f"{label} cancelled") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer to {label} within {timeout:.0f} s") from None


class Client:
    def __init__(self, host: str, port: int, token: str = "", timeout: float = 60.0,
                 client_name: str = "splatwright-client"):
        """Connect and authenticate; raises RemoteError if the server refuses (wrong token, other
        protocol version, busy) and OSError if it cannot be reached."""
        self.timeout = timeout
        self._events: queue.Queue = queue.Queue(MAX_QUEUED_EVENTS)
        self._send_lock = threading.Lock()
        self._pending: dict[int, PendingReply] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed_reason = ""
        # Frames travel raw on loopback, where bandwidth is free and encoding is not; compressed elsewhere.
        self.frame_format = "rgba8" if protocol.is_loopback(host) else "png"
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.hello = self._handshake(token, client_name)
        except BaseException:
            self.sock.close()
            raise
        self.sock.settimeout(None)  # the reader blocks until the server sends something
        self._reader = threading.Thread(target=self._read_loop, name="splatwright-client-reader", daemon=True)
        self._reader.start()

    def _handshake(self, token: str, client_name: str) -> dict:
        request_id = next(self._ids)
        fields = {"token": token, "protocol": protocol.PROTOCOL_VERSION, "client": client_name}
        protocol.send_message(self.sock, protocol.encode_message(protocol.REQUESTS, "hello", request_id, fields))
        try:
            reply = protocol.read_message(self.sock, SERVER_MESSAGES)
        except protocol.ConnectionClosed:
            raise ConnectionError("the server closed the connection during hello") from None
        if reply.type == "error":
            raise RemoteError(reply.fields["code"], reply.fields["message"])
        if reply.type != "reply" or reply.id != request_id:
            raise ConnectionError(f"unexpected {reply.type} message in answer to hello")
        return reply.fields

    # ---- requests ----

    def submit(self, type: str, fields: dict | None = None, payload: bytes | memoryview = b"",
               on_done: Callable[[PendingReply], None] | None = None) -> PendingReply:
        """Send a request without waiting; the returned PendingReply completes with its reply, and then calls
        `on_done` with itself (on the reader thread)."""
        request_id = next(self._ids)
        parts = protocol.encode_message(protocol.REQUESTS, type, request_id, fields, payload)  # validates
        pending = PendingReply(type, on_done)
        with self._pending_lock:
            if self._closed_reason:
                raise ConnectionError(self._closed_reason)
            self._pending[request_id] = pending
        try:
            with self._send_lock:
                protocol.send_message(self.sock, parts)
        except OSError as e:
            self._fail_all(f"connection to the backend lost while sending {type}: {e}")
        return pending

    def request(self, type: str, fields: dict | None = None, payload: bytes | memoryview = b"",
                timeout: float | None = None) -> Message:
        """Send a request and wait for its reply; raises RemoteError for an error reply."""
        return self.submit(type, fields, payload).result(self.timeout if timeout is None else timeout)

    def events(self, timeout: float | None = None):
        """Yield event fields as they arrive; stops after `timeout`
        seconds without an event or when the connection closes."""
        while True:
            try:
                event = self._events.get(timeout=timeout)
            except queue.Empty:
                return
            if event is None:
                return
            yield event

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        if threading.current_thread() is not self._reader:  # close() may be called from a reply callback
            self._reader.join(timeout=5)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- operations ----

    def capabilities(self) -> dict:
        return self.request("capabilities").fields

    def status(self) -> dict:
        return self.request("status").fields

    def open_session(self, name: str, create: bool = True) -> dict:
        return self.request("open_session", {"name": name, "create": create}).fields

    def add_view(self, camera: dict, image, name: str = "") -> dict:
        """`camera` from protocol.camera_to_wire; `image` is PNG bytes or an (H, W, 3 or 4) uint8 or float16
        array with rows bottom-up."""
        if isinstance(image, (bytes, bytearray)):
            format, payload = "png", image
        else:
            format, payload = protocol.image_to_wire(image)
        return self.request("add_view", {"camera": camera, "format": format, "name": name}, payload).fields

    def set_points(self, xyz: np.ndarray, rgb: np.ndarray) -> dict:
        """Initial points: positions (N, 3) and 8-bit colours (N, 3)."""
        return self.request("set_points", {"count": len(xyz)}, protocol.points_to_wire(xyz, rgb)).fields

    def start_training(self, **config) -> dict:
        """Keyword arguments are the start_training fields of protocol.REQUESTS."""
        return self.request("start_training", config).fields

    def pause(self) -> dict:
        return self.request("pause").fields

    def resume(self) -> dict:
        return self.request("resume").fields

    def stop(self) -> dict:
        return self.request("stop").fields

    def submit_render(self, camera: dict, format: str | None = None, depth: bool = False,
                      on_done: Callable[[PendingReply], None] | None = None) -> PendingReply:
        """Ask for a frame without waiting (in `format`, by default this connection's frame_format); a newer
        request supersedes this one if it has not started (its result() then raises RemoteError with code
        'superseded'). Decode with decode_frame and, with `depth`, decode_depth."""
        fields = {"camera": camera, "format": format or self.frame_format, "depth": depth}
        return self.submit("render", fields, on_done=on_done)

    def render(self, camera: dict, format: str | None = None, timeout: float | None = None) -> np.ndarray:
        """The (H, W, 4) uint8 frame, rows bottom-up (ready for a GPU texture; np.flipud for top-down)."""
        return decode_frame(self.submit_render(camera, format).result(self.timeout if timeout is None else timeout))

    def export_ply(self) -> bytes:
        return self.request("export_ply").payload

    def save_checkpoint(self) -> dict:
        return self.request("save_checkpoint").fields

    def load_checkpoint(self) -> dict:
        return self.request("load_checkpoint").fields

    def load_ply(self, data: bytes, background=(1.0, 1.0, 1.0)) -> dict:
        return self.request("load_ply", {"background": [float(c) for c in background]}, data).fields

    def shutdown(self) -> dict:
        return self.request("shutdown").fields

    # ---- reader thread ----

    def _read_loop(self) -> None:
        reason = "connection closed"
        try:
            while True:
                message = protocol.read_message(self.sock, SERVER_MESSAGES)
                if message.type == "event" or message.id == 0:
                    self._deliver_event(message)
                else:
                    with self._pending_lock:
                        pending = self._pending.pop(message.id, None)
                    if pending is not None:
                        pending._finish(*_outcome(message))
        except protocol.ConnectionClosed:
            reason = "the backend closed the connection"
        except ProtocolError as e:
            reason = f"bad frame from the backend: {e.message}"
        except OSError as e:
            reason = f"connection to the backend lost: {e}"
        self._fail_all(reason)

    def _deliver_event(self, message: Message) -> None:
        event = message.fields
        if message.type == "error":  # an error that answers no request, e.g. before the server hangs up
            event = {"event": "error", **message.fields}
        while True:
            try:
                self._events.put_nowait(event)
                return
            except queue.Full:  # nobody is reading: the oldest events go first
                try:
                    self._events.get_nowait()
                except queue.Empty:
                    pass

    def _fail_all(self, reason: str) -> None:
        with self._pending_lock:
            if not self._closed_reason:
                self._closed_reason = reason
            pending, self._pending = list(self._pending.values()), {}
        for p in pending:
            p._finish(error=ConnectionError(reason))
        try:
            self._events.put_nowait(None)  # ends events()
        except queue.Full:
            pass


def _outcome(message: Message) -> tuple[Message | None, Exception | None]:
    if message.type == "error":
        return None, RemoteError(message.fields["code"], message.fields["message"])
    return message, None


def decode_frame(reply: Message) -> np.ndarray:
    """The (H, W, 4) uint8 frame of a render reply, rows bottom-up whatever the wire format."""
    f = reply.fields
    image = memoryview(reply.payload)[:f.get("depth_offset", len(reply.payload))]
    if f["format"] == "png":
        return np.ascontiguousarray(protocol.decode_png(bytes(image))[::-1])
    return protocol.image_from_wire("rgba8", image, f["width"], f["height"])


def decode_depth(reply: Message) -> np.ndarray:
    """The (H, W) float32 depth plane of a render reply asked for with depth, rows bottom-up."""
    f = reply.fields
    plane = memoryview(reply.payload)[f["depth_offset"]:]
    if len(plane) != f["width"] * f["height"] * 4:
        raise ValueError(f"depth plane of {len(plane)} bytes does not fit a {f['width']}x{f['height']} frame")
    return np.frombuffer(plane, dtype="<f4").reshape(f["height"], f["width"])


def srgb_to_linear(x: np.ndarray) -> np.ndarray:
    """Display-referred sRGB values in [0, 1] to scene-linear ones (float32), what Blender's viewport and
    render results hold; its Standard view transform shows them as the display values again."""
    x = np.clip(np.asarray(x, dtype=np.float32), 0.0, 1.0)
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4).astype(np.float32)


_LINEAR_OF_BYTE = srgb_to_linear(np.arange(256) / 255.0)


def display_pixels(rgba: np.ndarray) -> np.ndarray:
    """An (H, W, 4) uint8 frame as flat float32 in [0, 1], still sRGB-encoded: what an sRGB texture takes
    (one multiply per value; the GPU decodes to scene-linear when it samples)."""
    return np.multiply(rgba.reshape(-1), np.float32(1.0 / 255.0), dtype=np.float32)


def linear_pixels(rgba: np.ndarray) -> np.ndarray:
    """An (H, W, 4) uint8 frame as flat float32 scene-linear RGB with alpha in [0, 1] (render results)."""
    flat = rgba.reshape(-1)
    pixels = _LINEAR_OF_BYTE[flat]
    pixels[3::4] = flat[3::4] * np.float32(1.0 / 255.0)
    return pixels


@dataclass(frozen=True)
class Frame:
    seq: int  # a higher number was asked for later
    tag: object  # what the asker attached to its request
    fields: dict  # the render reply's: width, height, step, ...
    pixels: np.ndarray  # display_pixels of the frame, rows bottom-up


class FrameStream:
    """Frames for a live view. ask() never waits: its thread sends the newest camera at once (the server
    supersedes a request still waiting behind a render) and turns the newest reply into the float buffer a
    texture upload takes, so the viewer's thread has nothing left to do but upload it.

    `client_of()` gives the connected Client or None; frames use its frame_format. `on_frame(frame)` is
    called on the stream's thread when a frame is ready."""

    def __init__(self, client_of: Callable[[], "Client | None"], on_frame: Callable[[Frame], None] | None = None):
        self._client_of, self._on_frame = client_of, on_frame
        self._cond = threading.Condition()
        self._wanted: tuple[dict, object] | None = None
        self._reply: tuple[int, object, Message] | None = None
        self._sent = 0  # requests sent
        self._newest = 0  # the newest request answered with a frame
        self._closed = False
        self.frame: Frame | None = None
        self.error = ""  # why the last request failed; cleared by the next frame
        self._thread = threading.Thread(target=self._run, name="splatwright-frames", daemon=True)
        self._thread.start()

    def ask(self, camera: dict, tag: object = None) -> None:
        """Request a frame of `camera` (protocol.camera_to_wire); replaces one not sent yet."""
        with self._cond:
            self._wanted = (camera, tag)
            self._cond.notify_all()

    def close(self) -> None:
        """Without waiting (it is called from Blender's drawing): the thread ends when it next looks."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._wanted or self._reply or self._closed)
                if self._closed:
                    return
                wanted, self._wanted = self._wanted, None
                reply, self._reply = self._reply, None
            if wanted is not None:
                self._send(*wanted)
            if reply is not None:
                self._prepare(*reply)

    def _send(self, camera: dict, tag: object) -> None:
        client = self._client_of()
        if client is None:
            self.error = "the backend is not connected"
            return
        self._sent += 1
        seq = self._sent
        try:
            client.submit_render(camera, on_done=lambda p: self._answered(seq, tag, p))
        except (ConnectionError, ValueError) as e:
            self.error = str(e)

    def _answered(self, seq: int, tag: object, pending: PendingReply) -> None:
        """On the client's reader thread: keep the reply if it is the newest, for _run to prepare."""
        try:
            reply = pending.result(0)
        except RemoteError as e:
            if e.code != protocol.SUPERSEDED:
                self.error = e.message
            return
        except ConnectionError as e:
            self.error = str(e)
            return
        with self._cond:
            if seq > self._newest:
                self._newest = seq
                self._reply = (seq, tag, reply)
                self._cond.notify_all()

    def _prepare(self, seq: int, tag: object, reply: Message) -> None:
        try:
            pixels = display_pixels(decode_frame(reply))
        except ValueError as e:
            self.error = f"bad frame from the backend: {e}"
            return
        self.frame, self.error = Frame(seq, tag, reply.fields, pixels), ""
        if self._on_frame is not None:
            self._on_frame(self.frame)

"""A small blocking client for the Splatwright backend server. Standard library + numpy only.

One reader thread receives every frame: replies (checked against what protocol.REPLIES declares for their
request) complete the request of their id, events go to a bounded queue read by `events()`. Requests may be
sent from any thread.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import mmap
import os
import queue
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

import numpy as np

from . import codecs, protocol
from .cameras import Camera
from .protocol import Message, ProtocolError, SERVER_MESSAGES

MAX_QUEUED_EVENTS = 1000


class RemoteError(Exception):
    """The server answered a request with an error."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} [{code}]")
        self.code, self.message = code, message


class PendingReply:
    """A request in flight; result() waits for its reply."""

    def __init__(self, type: str, on_done: Callable[["PendingReply"], None] | None = None, borrow: bool = False):
        self.type = type
        self._on_done = on_done  # called once finished, on the thread that finishes it
        self._done = threading.Event()
        self._reply: Message | None = None
        self._error: Exception | None = None
        self.borrow = borrow  # a frame in shared memory stays there, the payload a view of its slot, until release()
        self._release: Callable[[], None] | None = None
        self._release_lock = threading.Lock()

    @property
    def holds_shared_frame(self) -> bool:
        """Whether the reply's payload is a view of a shared-memory slot, until release()."""
        return self._release is not None

    def release(self) -> None:
        """Hand a borrowed frame's shared-memory slot back to the backend, once its payload is read: the reply's
        payload is empty from then on. Nothing to do for any other reply, and after the first call."""
        with self._release_lock:
            release, self._release = self._release, None
            if release is None:
                return
            if self._reply is not None:  # the backend may write the slot again
                self._reply = dataclasses.replace(self._reply, payload=b"")
        release()

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
            if task.done():  # answered just after the wait ran out, or failed with a timeout of its own
                return task.result(0)
            if cancelled():
                raise InterruptedError(f"{label} cancelled") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer to {label} within {timeout:.0f} s") from None


class Client:
    def __init__(self, host: str, port: int, token: str = "", timeout: float = 60.0,
                 client_name: str = "splatwright-client", shared_frames: bool = True):
        """Connect and authenticate; raises RemoteError if the server refuses (wrong token, other
        protocol version, busy) and OSError if it cannot be reached. With `shared_frames`, a backend on this
        machine hands raw frames over in shared memory (protocol.SHARED_FRAMES) where it can."""
        self.timeout = timeout
        self._events: queue.Queue = queue.Queue(MAX_QUEUED_EVENTS)
        self._send_lock = threading.Lock()
        self._pending: dict[int, PendingReply] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed_reason = ""
        # Frames travel raw on loopback, where bandwidth is free and encoding is not; compressed elsewhere.
        self.frame_format = "rgba8" if protocol.is_loopback(host) else "png"
        self.shared: MappedFrames | None = None  # the backend's shared-memory frames, where it could be mapped
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.hello = self._handshake(token, client_name, shared_frames and protocol.is_loopback(host))
            if self.hello["shared_frames"] is not None:
                self.shared = MappedFrames.open(**self.hello["shared_frames"])
        except BaseException:
            self.sock.close()
            raise
        self.sock.settimeout(None)  # the reader blocks until the server sends something
        self._reader = threading.Thread(target=self._read_loop, name="splatwright-client-reader", daemon=True)
        self._reader.start()

    def _handshake(self, token: str, client_name: str, shared_frames: bool) -> dict:
        request_id = next(self._ids)
        fields = {"token": token, "protocol": protocol.PROTOCOL_VERSION, "client": client_name,
                  "shared_frames": shared_frames}
        protocol.send_message(self.sock, protocol.encode_message(protocol.REQUESTS, "hello", request_id, fields))
        try:
            reply = protocol.read_message(self.sock, SERVER_MESSAGES)
        except protocol.ConnectionClosed:
            raise ConnectionError("the server closed the connection during hello") from None
        if reply.type == "error":
            raise RemoteError(reply.fields["code"], reply.fields["message"])
        if reply.type != "reply" or reply.id != request_id:
            raise ConnectionError(f"unexpected {reply.type} message in answer to hello")
        server_version = reply.fields.get("protocol")
        if server_version != protocol.PROTOCOL_VERSION:
            raise RemoteError(protocol.VERSION, f"the backend speaks protocol {server_version} but this client "
                              f"speaks {protocol.PROTOCOL_VERSION}; install matching versions of the add-on and "
                              "the backend")
        return protocol.check_reply("hello", reply).fields

    # ---- requests ----

    def submit(self, type: str, fields: dict | None = None, payload: bytes | memoryview = b"",
               on_done: Callable[[PendingReply], None] | None = None, borrow: bool = False) -> PendingReply:
        """Send a request without waiting; the returned PendingReply completes with its reply, and then calls
        `on_done` with itself (on the reader thread). `borrow`: PendingReply.borrow."""
        request_id = next(self._ids)
        parts = protocol.encode_message(protocol.REQUESTS, type, request_id, fields, payload)  # validates
        pending = PendingReply(type, on_done, borrow)
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
        if self.shared is not None and not self._reader.is_alive():
            self.shared.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- operations ----

    def call(self, type: str, **fields) -> dict:
        """A request without payload, its fields as keyword arguments (protocol.REQUESTS), e.g.
        call("open_session", name="scene") or call("start_training", preset="fast"); its reply's fields."""
        return self.request(type, fields).fields

    def add_view(self, camera: Camera, image, name: str = "", time: float | None = None) -> dict:
        """`image` is PNG bytes or an (H, W, 3 or 4) uint8 or float16 array with rows bottom-up; `time`: when it
        is seen, for a 4D model (protocol)."""
        if isinstance(image, (bytes, bytearray)):
            format, payload = "png", image
        else:
            format, payload = codecs.image_to_wire(image)
        return self.request("add_view", {"camera": camera, "format": format, "name": name, "time": time},
                            payload).fields

    def set_points(self, xyz: np.ndarray, rgb: np.ndarray) -> dict:
        """Initial points: positions (N, 3) and 8-bit colours (N, 3)."""
        return self.request("set_points", {"count": len(xyz)}, codecs.points_to_wire(xyz, rgb)).fields

    def submit_render(self, camera: Camera, format: str | None = None, depth: bool = False,
                      on_done: Callable[[PendingReply], None] | None = None, model: str | None = None,
                      crop=None, time: float | None = None, stream: int = 0, borrow: bool = False) -> PendingReply:
        """Ask for a frame without waiting (in `format`, by default this connection's frame_format); a newer
        request of the same `stream` supersedes this one if it has not started (its result() then raises
        RemoteError with code 'superseded'). Decode with decode_frame and, with `depth`, decode_depth. `model`,
        `crop` and `time`: which model, which part of it, and when (protocol.MODEL_CHOICE). With `borrow`, a
        frame in shared memory is read where it lies, without a copy, until the reply's release()."""
        format = format or self.frame_format
        fields = {"camera": camera, "format": format, "depth": depth, "model": model, "crop": crop, "time": time,
                  "stream": stream, "shared": self.shared is not None and format in codecs.RAW_FRAME_FORMATS}
        return self.submit("render", fields, on_done=on_done, borrow=borrow)

    def render(self, camera: Camera, format: str | None = None, timeout: float | None = None) -> np.ndarray:
        """The (H, W, 4) uint8 frame, rows bottom-up (ready for a GPU texture; np.flipud for top-down)."""
        return decode_frame(self.submit_render(camera, format).result(self.timeout if timeout is None else timeout))

    def load_ply(self, data: bytes, background=None, name: str = "", spz_axes: str = "ply") -> dict:
        """Show a splat file of any supported format, kept in a new session named after it (the reply's
        `session`), which opens; `name` is its file name (a .splat is known by it); `background`: the colour it is
        shown over (None: the training settings' default); `spz_axes`: those of an SPZ that does not say its own."""
        fields = {"name": name, "spz_axes": spz_axes}
        if background is not None:
            fields["background"] = [float(c) for c in background]
        return self.request("load_ply", fields, data).fields

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
                        pending._finish(*self._outcome(pending, message))
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


    def _outcome(self, pending: PendingReply, message: Message) -> tuple[Message | None, Exception | None]:
        if message.type == "error":
            return None, RemoteError(message.fields["code"], message.fields["message"])
        try:
            reply = protocol.check_reply(pending.type, message)
            slot = reply.fields.get("shared_slot")
            return (reply if slot is None else self._shared_reply(pending, reply, slot)), None
        except ProtocolError as e:
            return None, ConnectionError(f"bad reply from the backend: {e.message}")

    def _shared_reply(self, pending: PendingReply, reply: Message, slot: int) -> Message:
        """The render reply with its frame out of shared-memory slot `slot`: a view of the slot, released by
        the pending reply's release(), where it is borrowed, else a copy, and the slot released at once."""
        release = functools.partial(self._release_slot, slot)
        try:
            if self.shared is None:
                raise ProtocolError(protocol.BAD_FRAME, "a frame in shared memory on a connection without it")
            if reply.payload:
                raise ProtocolError(protocol.BAD_FRAME, "a frame both in shared memory and in the payload")
            payload = self.shared.view(slot, reply.fields["shared_bytes"])
            if pending.borrow:
                pending._release, release = release, None
            else:
                payload = bytearray(payload)
        finally:
            if release is not None:
                release()
        return Message(reply.type, reply.id, reply.fields, payload)

    def _release_slot(self, slot: int) -> None:
        with contextlib.suppress(ConnectionError):  # a closed connection's slots go with it
            self.submit("release_frame", {"slot": slot})


class MappedFrames:
    """The client's read-only mapping of the backend's shared-memory frames (protocol.SHARED_FRAMES)."""

    def __init__(self, map: mmap.mmap, slot_bytes: int):
        self.map, self.slot_bytes = map, slot_bytes

    @classmethod
    def open(cls, path: str, slot_bytes: int) -> "MappedFrames | None":
        """The mapping of the backend's file, or None where it cannot be read (frames then go through the
        socket)."""
        size = protocol.SHARED_SLOTS * slot_bytes
        try:
            with open(path, "rb") as file:
                if os.fstat(file.fileno()).st_size != size:
                    return None
                return cls(mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ), slot_bytes)
        except (OSError, ValueError):
            return None

    def view(self, slot: int, size) -> memoryview:
        """The first `size` bytes of `slot`, read-only (ProtocolError for a size the slot cannot hold)."""
        if size is None or size > self.slot_bytes:
            raise ProtocolError(protocol.BAD_FRAME, f"a shared frame of {size} bytes does not fit a slot of "
                                f"{self.slot_bytes}")
        start = slot * self.slot_bytes
        return memoryview(self.map)[start:start + size]

    def close(self) -> None:
        # A borrowed frame still being read keeps the mapping until its last view goes.
        with contextlib.suppress(BufferError):
            self.map.close()


def decode_frame(reply: Message) -> np.ndarray:
    """The (H, W, 4) uint8 frame of a render reply, rows bottom-up whatever the wire format."""
    f = reply.fields
    if f["format"] == "layer":
        return codecs.unpacked_layer(decode_pixels(reply))[0].reshape(f["height"], f["width"], 4)
    if f["format"] == "rgba32f":
        return np.rint(decode_pixels(reply) * 255).astype(np.uint8).reshape(f["height"], f["width"], 4)
    image = memoryview(reply.payload)[:_image_end(reply)]
    if f["format"] == "png":
        return np.ascontiguousarray(codecs.decode_png(bytes(image))[::-1])
    return codecs.image_from_wire("rgba8", image, f["width"], f["height"])


def decode_pixels(reply: Message) -> np.ndarray:
    """The flat float32 pixels of a "layer" or "rgba32f" render reply, as a float texture takes them, without a
    copy."""
    f = reply.fields
    return codecs.float_pixels_from_wire(f["format"], memoryview(reply.payload)[:_image_end(reply)], f["width"],
                                         f["height"])


def _image_end(reply: Message) -> int:
    """Where a render reply's image ends in its payload (a depth plane may follow)."""
    offset = reply.fields.get("depth_offset")
    return len(reply.payload) if offset is None else offset


def decode_depth(reply: Message) -> np.ndarray:
    """The (H, W) float32 depth plane of a render reply asked for with depth, rows bottom-up (a layer's depth
    within its packing's precision)."""
    f = reply.fields
    if f["format"] == "layer":
        return codecs.unpacked_layer(decode_pixels(reply))[1].reshape(f["height"], f["width"])
    plane = memoryview(reply.payload)[f["depth_offset"]:]
    if len(plane) != f["width"] * f["height"] * 4:
        raise ValueError(f"depth plane of {len(plane)} bytes does not fit a {f['width']}x{f['height']} frame")
    return np.frombuffer(plane, dtype="<f4").reshape(f["height"], f["width"])

"""Frames from the backend for the add-on's views (bpy-free): the live view's frame stream, and the part of a
frame a render border keeps."""
from __future__ import annotations

import itertools
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from .colors import display_pixels
from ..core import protocol
from ..core.cameras import Camera
from ..core.client import Client, PendingReply, RemoteError, decode_depth, decode_frame, decode_pixels
from ..core.codecs import FRAME_ENCODINGS, layer_pixels

_streams = itertools.count(1)  # each stream's own number: its requests supersede only each other

# A CPU backend renders with the cores training uses, so while it trains a live view asks for frames only once it
# rests, at this size, and leaves the backend FRAME_SHARE_FACTOR times a frame's round trip (at least
# CPU_MIN_SECONDS) between two: frames then take at most 1 / (1 + FRAME_SHARE_FACTOR) of its time.
CPU_TRAINING_SCALE = 0.5
FRAME_SHARE_FACTOR = 5.0
CPU_MIN_SECONDS = 1.0


def training_frame_gap(frame_seconds: float) -> float:
    """Seconds to leave a training CPU backend between two frames, after one took `frame_seconds`."""
    return max(CPU_MIN_SECONDS, FRAME_SHARE_FACTOR * frame_seconds)


def border_rect(render, width: int, height: int) -> tuple[int, int, int, int]:
    """The part of a width x height frame Blender renders: (x, y from the bottom-left, width, height) of the
    render border (`render`: use_border, border_min_x ... as bpy.types.RenderSettings has them), truncated
    to pixels as Blender does, or the whole frame without one."""
    if not render.use_border:
        return 0, 0, width, height
    x0, x1 = int(render.border_min_x * width), int(render.border_max_x * width)
    y0, y1 = int(render.border_min_y * height), int(render.border_max_y * height)
    return x0, y0, max(1, x1 - x0), max(1, y1 - y0)


@dataclass(frozen=True)
class Frame:
    seq: int  # a higher number was asked for later
    tag: object  # what the asker attached to its request
    fields: dict  # the render reply's: width, height, step, ...
    # Rows bottom-up: display_pixels of the frame; with FrameStream.depth, layer_pixels. Read-only; hold the Frame
    # while using them: once it is gone, its buffer (or shared-memory slot) may take a later frame.
    pixels: np.ndarray
    seconds: float = 0.0  # from its request's send to its reply


class Answer(NamedTuple):
    """A stream's reply waiting to be prepared."""
    seq: int
    tag: object
    pending: PendingReply  # finished, holding the reply
    seconds: float


class FrameStream:
    """Frames for a live view. ask() never waits: its thread sends the newest camera at once (the server
    supersedes this stream's request still waiting behind a render) and turns the newest reply into the float buffer a
    texture upload takes, so the viewer's thread has nothing left to do but upload it.

    `client_of()` gives the connected Client or None; frames use its frame_format. `on_frame(frame)` is
    called on the stream's thread when a frame is ready. `start(thread)` starts the stream's thread; Blender's
    drawing passes one that hands it to another thread, as Thread.start waits until the thread runs.
    With `depth` (settable until the first ask) frames also carry their view depth plane, packed with the
    colour (codecs.layer_pixels: by the backend, in a "layer" frame, on loopback), for views that composite them
    with the scene by depth. `model_choice` (model,
    crop and time: protocol.MODEL_CHOICE) goes with each request sent after it is set."""

    def __init__(self, client_of: Callable[[], "Client | None"], on_frame: Callable[[Frame], None] | None = None,
                 start: Callable[[threading.Thread], None] = threading.Thread.start):
        self._client_of, self._on_frame = client_of, on_frame
        self._cond = threading.Condition()
        self._wanted: tuple[Camera, object] | None = None
        self._reply: Answer | None = None  # the newest, to prepare
        self._number = next(_streams)
        self._sent = 0  # requests sent
        self._newest = 0  # the newest request answered with a frame
        self._closed = False
        self.frame: Frame | None = None
        self.error = ""  # why the last request failed; cleared by the next frame
        self.depth = False
        self.model_choice: dict = {}
        self._spare_buffers: list[np.ndarray] = []  # float buffers of frames no longer held
        self._thread = threading.Thread(target=self._run, name="splatwright-frames", daemon=True)
        start(self._thread)

    def ask(self, camera: Camera, tag: object = None) -> None:
        """Request a frame of `camera`; replaces one not sent yet."""
        with self._cond:
            self._wanted = (camera, tag)
            self._cond.notify_all()

    def close(self) -> None:
        """Without waiting (it is called from Blender's drawing): the thread ends when it next looks."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._wanted or self._reply or self._closed)
                    if self._closed:
                        return
                    wanted, self._wanted = self._wanted, None
                    answer, self._reply = self._reply, None
                if wanted is not None:
                    self._send(*wanted)
                if answer is not None:
                    self._prepare(answer)
        finally:  # closed, or failed: a reply waiting here, and any later one, gives its shared memory back
            with self._cond:
                self._closed = True
                waiting, self._reply = self._reply, None
            if waiting is not None:
                waiting.pending.release()

    def _send(self, camera: Camera, tag: object) -> None:
        client = self._client_of()
        if client is None:
            self.error = "the backend is not connected"
            return
        self._sent += 1
        seq, sent_at = self._sent, time.monotonic()
        if self.depth:  # colour and depth packed by the backend where the frame is raw; a remote one's PNG here
            format = "layer" if client.frame_format == "rgba8" else None
        else:  # in shared memory, the display floats made on the device: nothing to convert here
            format = "rgba32f" if client.shared is not None else None
        try:
            client.submit_render(camera, format, depth=self.depth, stream=self._number, borrow=True,
                                 on_done=lambda p: self._answered(seq, tag, p, time.monotonic() - sent_at),
                                 **self.model_choice)
        except (ConnectionError, ValueError) as e:
            self.error = str(e)

    def _answered(self, seq: int, tag: object, pending: PendingReply, seconds: float) -> None:
        """On the client's reader thread: keep the reply if it is the newest, for _run to prepare; a reply not
        prepared gives its frame's shared memory back at once."""
        try:
            pending.result(0)
        except RemoteError as e:
            if e.code != protocol.SUPERSEDED:
                self.error = e.message
            return
        except ConnectionError as e:
            self.error = str(e)
            return
        older = None
        with self._cond:
            newest = seq > self._newest and not self._closed
            if newest:
                self._newest = seq
                older, self._reply = self._reply, Answer(seq, tag, pending, seconds)
                self._cond.notify_all()
        if not newest:
            pending.release()
        elif older is not None:  # superseded before it was prepared
            older.pending.release()

    def _buffer(self, size: int) -> np.ndarray:
        """A float32 buffer of `size` values no frame holds: a frame-sized one costs more to make (the memory
        mapped in page by page) than to fill."""
        while self._spare_buffers:
            buffer = self._spare_buffers.pop()
            if buffer.size == size:
                return buffer
        return np.empty(size, np.float32)

    def _prepare(self, answer: Answer) -> None:
        """The reply's frame as the float buffer a texture takes, read where it lies. A display frame in shared
        memory is that buffer already: its frame holds the slot, released once the frame goes; any other frame's
        slot is released here."""
        pending = answer.pending
        reply = pending.result(0)
        buffer = None
        held = False
        try:
            encoding = FRAME_ENCODINGS[reply.fields["format"]]
            if encoding.float_pixels:
                pixels = decode_pixels(reply)  # the bytes received are the pixels
                held = pending.holds_shared_frame
                # A depth-composited view keeps a frame while it uploads it in strips and after (render/overlay.py),
                # one view per model, which would hold a connection's slots: its frame is copied out of the slot.
                if held and encoding.packs_depth:
                    buffer = self._buffer(pixels.size)
                    np.copyto(buffer, pixels)
                    pixels, held = buffer, False
            elif self.depth:
                pixels = layer_pixels(decode_frame(reply), decode_depth(reply))
            else:
                rgba = decode_frame(reply)
                pixels = buffer = display_pixels(rgba, self._buffer(rgba.size))
        except ValueError as e:
            self.error = f"bad frame from the backend: {e}"
            return
        finally:
            if not held:
                pending.release()
        self.frame, self.error = Frame(answer.seq, answer.tag, reply.fields, pixels, answer.seconds), ""
        if held:
            weakref.finalize(self.frame, pending.release)
        if buffer is not None:
            weakref.finalize(self.frame, self._spare_buffers.append, buffer)
        if self._on_frame is not None:
            self._on_frame(self.frame)

"""The add-on's link to the backend, free of bpy so it can never touch Blender data from a thread.

One worker thread runs jobs (every request, start and stop) one after another; a second thread per connection
forwards the server's events. Both only post Outcomes to a queue. The main thread submits jobs and, from a
bpy.app.timers poller, calls Backend.drain(), which alone updates the state the panels show. Live views have
their own FrameStream threads (frames.py) on the same connection, so a slow job never holds a frame back.
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core import client as wire, protocol
from ..core.errors import SplatwrightError
from .environment import LogTail, child_env, spawn
from .eta import StepClock
from .frames import FrameStream
from .messages import at_step, last_error_line, one_line

READY_TIMEOUT = 180.0  # the backend's first start imports torch and may build the CUDA rasterizer
REQUEST_TIMEOUT = 300.0
STOP_TIMEOUT = 30.0
EXIT_GRACE = 2.0  # seconds a lost local backend gets to exit, so its exit status and last words are known


class LocalServer:
    """`python -m backend.service` on loopback with a fresh random token, run from `sources` (the backend's
    sources bundled in the add-on): its working folder and its only PYTHONPATH entry."""

    def __init__(self, python: str, sources: str, workdir: str):
        root = Path(sources)
        if not (root / "backend" / "service" / "__main__.py").is_file():
            raise SplatwrightError(f"{root} holds no backend/ package; reinstall the add-on from its zip")
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise SplatwrightError(f"Python {python!r} not found; press Set Up Backend in the add-on "
                                   "preferences or choose another Python that has torch")
        self.token = secrets.token_urlsafe(32)
        self._token_dir = tempfile.mkdtemp(prefix="splatwright-")  # private to this user (mode 0700)
        token_file = Path(self._token_dir) / "token"
        token_file.write_text(self.token)
        self._ports: queue.Queue[int] = queue.Queue()
        self.port: int | None = None  # known once ready; a reconnect to the running server reuses it
        # --exit-with-parent: the backend stops once the pipe on its stdin ends, which the system closes here
        # however Blender ends (a crash too); self.proc.stdin holds it open until then.
        self.proc = spawn([python, "-u", "-m", "backend.service", "--port", "0", "--workdir", workdir,
                           "--token-file", str(token_file), "--exit-with-parent"], root,
                          child_env(PYTHONPATH=str(root)), stdin=subprocess.PIPE)
        self.log = LogTail(on_line=self._ready_line)
        self.log.follow(self.proc.stdout)

    def _ready_line(self, line: str) -> None:
        if line.startswith("{"):
            try:
                message = json.loads(line)
            except ValueError:
                return
            if isinstance(message, dict) and message.get("event") == "ready":
                self._ports.put(int(message["port"]))

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> int:
        """The port, once the server listens (it has read its token file by then, so that goes)."""
        if self.port is not None:
            return self.port
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                try:
                    self.port = self._ports.get(timeout=0.2)
                    return self.port
                except queue.Empty:
                    if self.proc.poll() is not None:
                        raise SplatwrightError(f"the backend exited with code {self.proc.returncode} before it "
                                               f"was ready: {self.tail()}") from None
            self.proc.kill()
            raise SplatwrightError(f"the backend was not ready within {timeout:.0f} s: {self.tail()}")
        finally:
            shutil.rmtree(self._token_dir, ignore_errors=True)

    def tail(self, n: int = 3) -> str:
        return " | ".join(self.log.last(n)) or "no output"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass(frozen=True)
class ConnectSettings:
    mode: str  # 'LOCAL' or 'REMOTE'
    python: str
    sources: str  # the backend's sources: see LocalServer
    workdir: str
    host: str
    port: int
    token: str


@dataclass
class Outcome:
    kind: str  # done, error, event, closed
    label: str = ""
    value: object = None
    then: Callable | None = None


class Backend:
    def __init__(self):
        self._jobs: queue.Queue = queue.Queue()
        self._outcomes: queue.Queue[Outcome] = queue.Queue()
        self._client: wire.Client | None = None  # set by the worker; frame streams read it
        self._client_is_local = False  # worker thread only
        self.server: LocalServer | None = None  # set by the worker; the main thread may kill it
        # State for the UI, read and written on the main thread only:
        self.connection = "disconnected"  # disconnected, connecting, connected, lost
        self.remote = False  # the backend runs elsewhere: what comes from it crosses a network
        self.detail = ""  # why the connection is what it is
        self.capabilities: dict = {}
        self.status: dict = {}  # the backend's status (protocol.STATUS)
        self.progress: dict = {}  # the latest progress event
        self.reconstruction: dict = {}  # the latest reconstruction event (structure from motion of photos)
        self.clock = StepClock()  # training's steps over time: the time it has left
        self.in_flight: Counter = Counter()  # job label -> count
        self.errors: dict[str, str] = {}  # what failed -> why, oldest first; cleared once it works again
        self.revision = 0  # counts what may change the model shown: connections, progress and state events
        self._generation = 0  # connection number; events of older connections are ignored
        self._closing = False  # a stop or kill was asked for, so a closed connection is not 'lost'
        self._worker = threading.Thread(target=self._work, name="splatwright-worker", daemon=True)
        self._worker.start()
        # Threads the main thread wants started: Thread.start waits until the new thread runs, which on a
        # loaded machine can take long, so a redraw hands its frame stream's thread to this one.
        self._to_start: queue.Queue[threading.Thread | None] = queue.Queue()
        threading.Thread(target=self._start_threads, name="splatwright-starter", daemon=True).start()

    # ---- main thread: submit ----

    def call(self, label: str, fn: Callable[[wire.Client], object], then: Callable | None = None) -> None:
        """Run fn(client) on the worker; `then(result)` runs on the main thread in drain()."""
        self._submit(label, lambda: fn(self._connected_client()), then)

    def wait(self, label: str, fn: Callable[[wire.Client], object], timeout: float,
             cancelled: Callable[[], bool]) -> object:
        """Run fn(client) on the worker after the jobs before it and return its value; for a render thread,
        never the UI's main thread. Raises what fn raised, TimeoutError, or InterruptedError once
        `cancelled()` says so (polled 10 times a second)."""
        future = Future()

        def job():  # the waiting caller reports what fails, so the worker does not report it again
            try:
                future.set_result(fn(self._connected_client()))
            except BaseException as e:
                future.set_exception(e)
        self._submit(label, job)
        return wire.wait_done(future, label, timeout, cancelled)

    def frame_stream(self) -> FrameStream:
        """Frames of a live view over this backend's connection (whichever is current)."""
        return FrameStream(lambda: self._client, start=self._to_start.put)

    @property
    def last_error(self) -> str:
        """The newest error still standing, as reported, or ''."""
        return next(reversed(self.errors.values()), "")

    def connect(self, settings: ConnectSettings, reopen: str = "") -> None:
        """Connect (starting a local backend); a backend with no session open then reopens session `reopen`
        and its checkpoint, as after a crash."""
        self.connection, self.detail, self._closing = "connecting", "", False
        self.remote = settings.mode != "LOCAL"
        self._generation += 1
        generation = self._generation
        self._submit("connect", lambda: self._connect(settings, generation, reopen), self._connected)

    def stop(self) -> None:
        """Shut the backend down cleanly (training stops with a checkpoint); a remote one is only left."""
        self._closing = True
        self._submit("stop", self._shutdown)

    def kill(self) -> None:
        """End the local backend process at once, which frees all its GPU memory."""
        self._closing = True
        if self.server is not None:
            self.server.proc.kill()
        self._submit("kill", self._disconnect)

    def close(self) -> None:
        """At unregister or exit: end the worker, ask a local backend to stop (SIGTERM: it checkpoints)."""
        self._jobs.put(None)
        self._to_start.put(None)
        if self.server is not None and self.server.alive:
            self.server.proc.terminate()
        client = self._client
        if client is not None:
            client.close()
        self._worker.join(timeout=1.0)

    def _connected_client(self) -> wire.Client:  # on the worker
        if self._client is None:
            raise SplatwrightError("the backend is not connected; start it in the Splats panel")
        return self._client

    def _submit(self, label: str, job: Callable, then: Callable | None = None) -> None:
        self.in_flight[label] += 1
        self._jobs.put((label, job, then))

    # ---- main thread: apply outcomes ----

    def drain(self) -> tuple[bool, list[tuple[str, str]]]:
        """Apply what the threads posted. Returns (anything changed, [(level, message) to report])."""
        changed, reports = False, []
        while True:
            try:
                out = self._outcomes.get_nowait()
            except queue.Empty:
                return changed, reports
            changed = True
            if out.kind in ("done", "error"):
                self.in_flight[out.label] -= 1
                if self.in_flight[out.label] <= 0:
                    del self.in_flight[out.label]
            if out.kind == "done":
                self.errors.pop(out.label, None)  # it works again
                try:
                    message = out.then(out.value) if out.then is not None else ""
                except SplatwrightError as e:
                    out = Outcome("error", out.label, str(e))
                else:
                    if message:
                        reports.append(("INFO", one_line(message)))
            if out.kind == "error":
                reports.append(("ERROR", self._failed(out.label, f"{out.label.replace('_', ' ')}: {out.value}")))
                if out.label == "connect":
                    self.connection, self.detail = "disconnected", one_line(out.value)
            elif out.kind == "event":
                reports += self._apply_event(out.value)
            elif out.kind == "closed" and out.value[0] == self._generation:
                reports += self._closed(out.value[1])

    def _failed(self, what: str, message: str) -> str:
        """Keep `message` as the newest error about `what`; returns it as one line."""
        self.errors.pop(what, None)
        self.errors[what] = one_line(message)
        return self.errors[what]

    def _connected(self, reply: dict) -> str:
        self.connection, self.detail = "connected", ""
        self.capabilities, self.status, self.progress = reply["capabilities"], reply["status"], {}
        self.errors.clear()  # a new connection: what failed on the old one is moot, but for a failed training
        self.revision += 1
        caps = self.capabilities
        said = [f"backend ready: {caps.get('gpu') or caps.get('device')}, torch {caps.get('torch')}"]
        if reply["reopened"]:
            said.append(reply["reopened"])
        if reason := self.status.get("reason"):
            said.append(self._failed("backend", f"the training of {self.status['session']} failed {reason}"))
        return "; ".join(said)

    def _apply_event(self, event: dict) -> list[tuple[str, str]]:
        kind = event.get("event")
        if kind in ("progress", "state"):  # the backend sends one after every change of the model shown
            self.revision += 1
        if kind == "progress":
            self.progress = event
            if "step" in event and event.get("iterations"):
                self.clock.observe(event["step"], event["iterations"], time.monotonic())
            self.status.update({k: event[k] for k in ("state", "step", "iterations", "gaussians", "views")
                                if k in event})
        elif kind == "state":
            was = self.status.get("state")
            self.status = {k: v for k, v in event.items() if k != "event"}
            if self.status.get("state") != "training":
                self.clock.pause()  # paused, stopped or finished: no step time until it trains again
            if self.status.get("state") == "training":
                self.errors.pop("backend", None)  # training runs again
            elif self.status.get("state") == "finished" and was in protocol.RUNNING:
                return [("INFO", self._finished_note())]
        elif kind == "reconstruction":
            self.reconstruction = event
            if event["state"] == "failed":
                return [("ERROR", self._failed("reconstruction", event["message"]))]
            self.errors.pop("reconstruction", None)
            if event["state"] == "cancelled":
                return [("WARNING", one_line(event["message"]))]
        elif kind == "error":
            return [("ERROR", self._failed("backend", f"backend: {event.get('message')}"))]
        elif kind == "warning":
            return [("WARNING", one_line(f"backend: {event.get('message')}"))]
        return []

    def _finished_note(self) -> str:
        """What a report says when training finishes."""
        s = self.status
        return (f"training of {s.get('session')} finished: step {s.get('step', 0)} of {s.get('iterations', 0)}, "
                f"{s.get('gaussians', 0):,} Gaussians")

    def _closed(self, exit_note: str) -> list[tuple[str, str]]:
        """The connection closed: the panels stop showing the backend's state (nothing trains any more as far
        as they know), and a loss nobody asked for is an error."""
        self.status, self.progress = {}, {}
        self.revision += 1
        if self._closing:
            self.connection, self.detail = "disconnected", "stopped" + exit_note
            return []
        self.connection, self.detail = "lost", "the connection to the backend closed" + exit_note
        return [("ERROR", self._failed("connection", self.detail))]

    # ---- worker threads ----

    def _start_threads(self) -> None:
        while (thread := self._to_start.get()) is not None:
            thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            label, fn, then = job
            try:
                value = fn()
            except wire.RemoteError as e:
                self._outcomes.put(Outcome("error", label, e.message))
            except SplatwrightError as e:
                self._outcomes.put(Outcome("error", label, str(e)))
            except (OSError, TimeoutError, ValueError) as e:
                self._outcomes.put(Outcome("error", label, f"{type(e).__name__}: {e}"))
            except Exception as e:  # a bug: report it and keep the worker alive for the next job
                traceback.print_exc()
                self._outcomes.put(Outcome("error", label, f"internal error: {e!r}; see the system console"))
            else:
                self._outcomes.put(Outcome("done", label, value, then))

    def _connect(self, s: ConnectSettings, generation: int, reopen: str) -> dict:
        self._disconnect()
        if s.mode == "LOCAL":
            if self.server is None or not self.server.alive:
                self.server = LocalServer(s.python, s.sources, s.workdir)
            host, port, token = "127.0.0.1", self.server.wait_ready(), self.server.token
        else:
            host, port, token = s.host, s.port, s.token
        try:
            client = wire.Client(host, port, token, timeout=REQUEST_TIMEOUT, client_name="splatwright-blender")
        except OSError as e:
            raise SplatwrightError(f"cannot reach the backend at {host}:{port} ({e})") from None
        self._client, self._client_is_local = client, s.mode == "LOCAL"
        threading.Thread(target=self._forward_events, args=(client, generation, self.server if s.mode == "LOCAL"
                                                            else None), name="splatwright-events", daemon=True).start()
        capabilities, status = client.call("capabilities"), client.call("status")
        reopened = self._reopen(client, reopen) if reopen and status["session"] is None else ""
        return {"capabilities": capabilities, "status": client.call("status") if reopened else status,
                "reopened": reopened}

    @staticmethod
    def _reopen(client: wire.Client, session: str) -> str:
        """Open an existing session and load its checkpoint if it has one; what happened, or '' if there is no
        such session."""
        try:
            status = client.call("open_session", name=session, create=False)
        except wire.RemoteError:
            return ""  # gone, or kept by another backend: nothing to reopen
        if not status["checkpoint"]:
            return f"reopened session {session} ({status['views']} views, no checkpoint yet)"
        try:
            step = client.call("load_checkpoint")["step"]
        except wire.RemoteError as e:
            return f"reopened session {session}, but its checkpoint did not load: {e.message}"
        return f"reopened session {session} and its model{at_step(step)}"

    def _forward_events(self, client: wire.Client, generation: int, server: LocalServer | None) -> None:
        for event in client.events():
            self._outcomes.put(Outcome("event", value=event))
        self._outcomes.put(Outcome("closed", value=(generation, exit_note(server) if server else "")))

    def _shutdown(self) -> None:
        if self._client is not None and self._client_is_local:
            try:
                self._client.call("shutdown")
            except (wire.RemoteError, OSError, TimeoutError):
                pass  # already gone: the kill below makes sure
            try:
                self.server.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.server.proc.kill()
        self._disconnect()

    def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


def exit_note(server: LocalServer) -> str:
    """How a local backend ended, with the last line of its log that says why; '' while it runs."""
    try:
        code = server.proc.wait(EXIT_GRACE)
    except subprocess.TimeoutExpired:
        return ""
    time.sleep(0.2)  # the log's reader thread takes the process's last lines after it exits
    reason = last_error_line(server.log.last(200))
    return f" (the process exited with code {code}{': ' + reason if reason else ''})"

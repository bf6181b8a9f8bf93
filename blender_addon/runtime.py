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
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .core import client as wire
from .core.errors import SplatwrightError
from .frames import FrameStream

READY_TIMEOUT = 180.0  # the backend's first start imports torch and may build the CUDA rasterizer
REQUEST_TIMEOUT = 300.0
STOP_TIMEOUT = 30.0


def defaults() -> dict:
    """Where build_addon.py found the backend and its .venv when the add-on was built."""
    try:
        return json.loads((Path(__file__).parent / "core" / "defaults.json").read_text())
    except (OSError, ValueError):
        return {}


class LogTail:
    """The last lines a child process wrote to `stream`, read by a daemon thread."""

    def __init__(self, stream, keep: int = 200, on_line: Callable[[str], None] | None = None):
        self._lines: deque[str] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._on_line = on_line
        threading.Thread(target=self._read, args=(stream,), name="splatwright-log", daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            line = line.rstrip()
            with self._lock:
                self._lines.append(line)
            if self._on_line:
                self._on_line(line)

    def last(self, n: int) -> list[str]:
        with self._lock:
            return list(self._lines)[-n:]


def _spawn(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)


class Setup:
    """`./run setup` (creates or updates the backend's .venv) in a child process, its log kept for the UI."""

    def __init__(self, backend_root: str):
        script = Path(backend_root) / "run"
        if not script.is_file():
            raise SplatwrightError(f"{script} not found; set the backend folder (the Splatwright checkout) "
                                   "in the add-on preferences")
        self.proc = _spawn([str(script), "setup"], script.parent)
        self.log = LogTail(self.proc.stdout)

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()


class LocalServer:
    """`python -m backend serve` on loopback with a fresh random token."""

    def __init__(self, python: str, backend_root: str, workdir: str):
        root = Path(backend_root)
        if not (root / "backend" / "__main__.py").is_file():
            raise SplatwrightError(f"{root} holds no backend/ package; set the backend folder (the Splatwright "
                                   "checkout) in the add-on preferences")
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise SplatwrightError(f"Python {python!r} not found; press 'Set up environment' in the add-on "
                                   "preferences or choose another Python that has torch")
        self.token = secrets.token_urlsafe(32)
        self._token_dir = tempfile.mkdtemp(prefix="splatwright-")  # private to this user (mode 0700)
        token_file = Path(self._token_dir) / "token"
        token_file.write_text(self.token)
        self._ports: queue.Queue[int] = queue.Queue()
        self.port: int | None = None  # known once ready; a reconnect to the running server reuses it
        self.proc = _spawn([python, "-u", "-m", "backend", "serve", "--port", "0",
                            "--workdir", workdir or str(root / "out" / "sessions"),
                            "--token-file", str(token_file), "--exit-with-parent"], root)
        self.log = LogTail(self.proc.stdout, on_line=self._ready_line)

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
    backend_root: str
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
        self.detail = ""  # why the connection is what it is
        self.capabilities: dict = {}
        self.status: dict = {}  # session, state, views, step, iterations, gaussians, checkpoint
        self.progress: dict = {}  # the latest progress event
        self.in_flight: Counter = Counter()  # job label -> count
        self.last_error = ""
        self.revision = 0  # counts what may change the model shown: connections, progress and state events
        self._generation = 0  # connection number; events of older connections are ignored
        self._closing = False  # a stop or kill was asked for, so a closed connection is not 'lost'
        self._worker = threading.Thread(target=self._work, name="splatwright-worker", daemon=True)
        self._worker.start()

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
        return FrameStream(lambda: self._client)

    def connect(self, settings: ConnectSettings) -> None:
        self.connection, self.detail, self._closing = "connecting", "", False
        self._generation += 1
        generation = self._generation
        self._submit("connect", lambda: self._connect(settings, generation), self._connected)

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
            if out.kind == "done" and out.then is not None:
                try:
                    message = out.then(out.value)
                except SplatwrightError as e:
                    out = Outcome("error", out.label, str(e))
                else:
                    if message:
                        reports.append(("INFO", message))
            if out.kind == "error":
                self.last_error = f"{out.label}: {out.value}"
                reports.append(("ERROR", self.last_error))
                if out.label == "connect":
                    self.connection, self.detail = "disconnected", str(out.value)
            elif out.kind == "event":
                reports += self._apply_event(out.value)
            elif out.kind == "closed" and out.value == self._generation:
                self._closed()

    def _connected(self, reply: dict) -> str:
        self.connection, self.detail = "connected", ""
        self.capabilities, self.status, self.progress = reply["capabilities"], reply["status"], {}
        self.revision += 1
        caps = self.capabilities
        return f"backend ready: {caps.get('gpu') or caps.get('device')}, torch {caps.get('torch')}"

    def _apply_event(self, event: dict) -> list[tuple[str, str]]:
        kind = event.get("event")
        if kind in ("progress", "state"):  # the backend sends one after every change of the model shown
            self.revision += 1
        if kind == "progress":
            self.progress = event
            self.status.update({k: event[k] for k in ("state", "step", "iterations", "gaussians", "views")
                                if k in event})
        elif kind == "state":
            self.status = {k: v for k, v in event.items() if k != "event"}
        elif kind == "error":
            self.last_error = str(event.get("message"))
            return [("ERROR", f"backend: {self.last_error}")]
        return []

    def _closed(self) -> None:
        server = self.server
        exit_note = ""
        if server is not None and server.proc.poll() is not None:
            exit_note = f" (the process exited with code {server.proc.returncode}: {server.tail()})"
        if self._closing:
            self.connection, self.detail = "disconnected", "stopped" + exit_note
        else:
            self.connection, self.detail = "lost", "the connection to the backend closed" + exit_note
            self.last_error = self.detail

    # ---- worker thread ----

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

    def _connect(self, s: ConnectSettings, generation: int) -> dict:
        self._disconnect()
        if s.mode == "LOCAL":
            if self.server is None or not self.server.alive:
                self.server = LocalServer(s.python, s.backend_root, s.workdir)
            host, port, token = "127.0.0.1", self.server.wait_ready(), self.server.token
        else:
            host, port, token = s.host, s.port, s.token
        try:
            client = wire.Client(host, port, token, timeout=REQUEST_TIMEOUT, client_name="splatwright-blender")
        except OSError as e:
            raise SplatwrightError(f"cannot reach the backend at {host}:{port} ({e})") from None
        self._client, self._client_is_local = client, s.mode == "LOCAL"
        threading.Thread(target=self._forward_events, args=(client, generation), name="splatwright-events",
                         daemon=True).start()
        return {"capabilities": client.call("capabilities"), "status": client.call("status")}

    def _forward_events(self, client: wire.Client, generation: int) -> None:
        for event in client.events():
            self._outcomes.put(Outcome("event", value=event))
        self._outcomes.put(Outcome("closed", value=generation))

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

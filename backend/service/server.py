"""The backend server: `python -m backend serve`, or `python -m backend.service` (the server alone).

TCP on loopback by default (anywhere else only with a token), one client at a time. Each connection has a
reader (this module: frames in, requests dispatched) and a writer thread (frames out from a queue), so
neither training nor a slow client ever blocks reading the socket. The Engine (engine.py) owns the model.

A connection is a stranger until its hello is accepted: it holds no client slot, may send nothing but one
small hello, within one deadline for all of it, and hears no more of the protocol than that; wrong tokens are
rate-limited per address. A client that stops reading is dropped once its queued replies pass a bound.
"""
from __future__ import annotations

import hmac
import json
import os
import queue
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from dataclasses import fields
from pathlib import Path

import torch

from blender_addon.core import codecs, protocol
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import REQUESTS, SERVER_MESSAGES, Message, ProtocolError
from ..distributed import check_gpus
from ..policy import resolve_device
from ..train import warm_up
from . import shared_frames
from .engine import Engine
from .exports import convert
from .frames import decode_upload
from .limits import Limits
from .log import log
from .render_queue import RenderJob
from .shared_frames import SharedFrames

HELLO_TIMEOUT = 10.0  # seconds a new connection has for the whole of its hello
BUSY_WAIT = 1.0  # a reconnecting client may arrive before its previous connection is torn down
DRAIN_TIMEOUT = 1.0
MAX_QUEUED_EVENTS = 64  # events beyond this are dropped while the client is not reading
MAX_QUEUED_BYTES = 256 << 20  # replies queued beyond this (the client is not reading) drop the connection
MAX_STRANGERS = 256  # connections not yet authenticated; beyond this the one that waited longest is dropped
ACCEPT_BACKOFF = (0.05, 2.0)  # first and longest wait after accept() fails (e.g. out of file descriptors)
STOP_WAIT = 1.0  # seconds a stopping server waits for its connections to close
PARENT_POLL_SECONDS = 1.0  # how often --exit-with-parent reads the parent's pid (watch_parent)
FIRST_MESSAGE = (f"the first message must be a hello with the token and protocol version, no payload, at most "
                 f"{protocol.MAX_HELLO_HEADER_BYTES} bytes")


class WrongTokens:
    """Wrong tokens per peer host: a host may try BURST times at once, then RATE times a second; beyond that
    its hellos are refused unchecked. The log gets one line per host per LOG_EVERY seconds, with the count."""
    BURST, RATE, LOG_EVERY = 10, 2.0, 60.0

    def __init__(self):
        self.lock = threading.Lock()
        self.hosts: dict[str, list[float]] = {}  # host: [allowance, time of that allowance, failures unlogged, last log]

    def _entry(self, host: str, now: float) -> list[float]:
        entry = self.hosts.setdefault(host, [self.BURST, now, 0, -self.LOG_EVERY])
        entry[0] = min(self.BURST, entry[0] + (now - entry[1]) * self.RATE)
        entry[1] = now
        return entry

    def refused(self, host: str) -> bool:
        with self.lock:
            return self._entry(host, time.monotonic())[0] < 1

    def failed(self, host: str) -> None:
        now = time.monotonic()
        with self.lock:
            entry = self._entry(host, now)
            entry[0] -= 1
            entry[2] += 1
            if now - entry[3] >= self.LOG_EVERY:
                log(f"{host}: {int(entry[2])} wrong token(s); the next are counted and logged at most once a minute")
                entry[2], entry[3] = 0, now
            if len(self.hosts) > 4096:  # forget hosts that have been quiet long enough to have their allowance back
                self.hosts = {h: e for h, e in self.hosts.items() if (now - e[1]) * self.RATE < self.BURST}


class Connection:
    def __init__(self, sock: socket.socket, address: tuple):
        self.sock, self.address = sock, f"{address[0]}:{address[1]}"
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A client that vanished without closing (a crashed or unplugged machine) would hold the one client
        # slot for hours; keepalive probes find it within about half a minute.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):  # Linux names; other systems keep their defaults
                self.sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
        self.outbox: queue.Queue = queue.Queue()
        self.hello: Message | None = None  # once accepted
        self.shared: SharedFrames | None = None  # frames through shared memory, where the hello asked for them
        self.queued_bytes = 0  # of the frames in the outbox
        self.lock = threading.Lock()
        self.closed = False
        self.writer = threading.Thread(target=self._write_loop, name=f"write {self.address}", daemon=True)
        self.writer.start()

    def reply(self, request: Message, fields: dict, payload: bytes | memoryview = b"") -> None:
        self._queue(protocol.encode_reply(request.type, request.id, fields, payload))

    def error(self, request_id: int, code: str, message: str) -> None:
        self._send("error", request_id, {"code": code, "message": message[:protocol.MAX_TEXT_CHARS]})

    def event(self, fields: dict) -> None:
        if self.outbox.qsize() < MAX_QUEUED_EVENTS:
            self._send("event", 0, fields)

    def _send(self, type: str, request_id: int, fields: dict) -> None:
        self._queue(protocol.encode_message(SERVER_MESSAGES, type, request_id, fields))

    def _queue(self, parts: list) -> None:
        """Queue a frame for the writer; a client with more than MAX_QUEUED_BYTES unread is dropped (the first
        frame in an empty queue always goes, however large)."""
        size = sum(len(part) for part in parts)
        with self.lock:
            if self.closed:
                return
            if self.queued_bytes and self.queued_bytes + size > MAX_QUEUED_BYTES:
                log(f"{self.address}: more than {MAX_QUEUED_BYTES >> 20} MiB of replies unread; dropping the "
                    "connection")
                self.drop()
                return
            self.queued_bytes += size
        self.outbox.put(parts)

    def drop(self) -> None:
        """End the connection now: its reader and writer stop at once, whatever they wait on."""
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _write_loop(self) -> None:
        broken = False
        while (parts := self.outbox.get()) is not None:
            if not broken:
                try:
                    protocol.send_message(self.sock, parts)
                except OSError:
                    broken = True  # the reader notices too; what is still queued is dropped
            with self.lock:
                self.queued_bytes -= sum(len(part) for part in parts)
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        """Send what is queued, then read until the peer closes: closing with unread input would reset
        the connection and could destroy the last error message before the peer reads it."""
        self.closed = True
        self.outbox.put(None)
        self.writer.join(DRAIN_TIMEOUT)
        deadline = time.monotonic() + DRAIN_TIMEOUT
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                if not self.sock.recv(1 << 16):
                    break
        except OSError:
            pass
        self.sock.close()


class Server:
    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0, token: str = ""):
        self.engine, self.token = engine, token.encode("utf-8")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family, backlog=128)
        self.listener.settimeout(0.2)  # how often the accept loop checks for a stop request
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.slot = threading.Condition()
        self.active: Connection | None = None
        self.connections: dict[Connection, float] = {}  # every open connection: when it was accepted
        self.strangers: set[Connection] = set()  # those whose hello is not accepted yet
        self.connections_lock = threading.Lock()
        self.wrong_tokens = WrongTokens()
        self.threads: list[threading.Thread] = []
        self.rendering_done = True  # False once stopped while a render it could not interrupt still runs
        self.handlers = {
            "hello": self._hello_again, "capabilities": lambda m: (self.engine.capabilities(), b""),
            "status": lambda m: (self.engine.status(), b""),
            "open_session": lambda m: (self.engine.open_session(m.fields["name"], m.fields["create"]), b""),
            "add_view": self._add_view, "set_points": self._set_points,
            "start_training": lambda m: (self.engine.start_training(m.fields, m.payload), b""),
            "pause": lambda m: (self.engine.pause(), b""), "resume": lambda m: (self.engine.resume(), b""),
            "stop": lambda m: (self.engine.stop(), b""),
            "export_ply": lambda m: self.engine.export_ply(m.fields["name"], m.fields["model"], m.fields["crop"],
                                                           m.fields["time"], m.fields["placement"],
                                                           m.fields["motion"]),
            "convert_model": lambda m: convert(m.payload, m.fields["name"], m.fields["placement"],
                                               self.engine.limits.budget()),
            "save_checkpoint": lambda m: (self.engine.save_checkpoint(), b""),
            "load_checkpoint": lambda m: (self.engine.load_checkpoint(), b""),
            "load_ply": lambda m: (self.engine.load_ply(m.payload, m.fields["background"], m.fields["name"],
                                                        m.fields["spz_axes"]), b""),
            "upload_photo": lambda m: (self.engine.reconstructions.upload(
                m.fields["capture"], m.fields["file"], m.fields["offset"], m.fields["first"], m.payload), b""),
            "cancel_reconstruction": lambda m: (self.engine.reconstructions.cancel(), b""),
            "fetch_reconstruction": lambda m: self.engine.reconstructions.fetch(m.fields["capture"]),
        }
        self.connection_handlers = {"release_frame": self._release_frame, "reconstruct": self._reconstruct}

    def serve_forever(self) -> None:
        backoff = 0.0
        try:
            while not self.stopping.is_set():
                try:
                    sock, address = self.listener.accept()
                except TimeoutError:
                    continue
                except OSError as e:  # out of file descriptors or memory, a connection reset before accept, ...
                    if not backoff:
                        log(f"cannot accept connections ({e}); retrying")
                    backoff = min(ACCEPT_BACKOFF[1], max(ACCEPT_BACKOFF[0], 2 * backoff))
                    self.stopping.wait(backoff)
                    continue
                if backoff:
                    log("accepting connections again")
                    backoff = 0.0
                self._start_connection(sock, address)
        finally:
            self.listener.close()
            self.rendering_done = self.engine.close()
            self._close_connections()

    def stop(self) -> None:
        self.stopping.set()

    def _start_connection(self, sock: socket.socket, address: tuple) -> None:
        conn = Connection(sock, address)
        with self.connections_lock:
            self.connections[conn] = time.monotonic()
            self.strangers.add(conn)
            crowd = sorted(self.strangers, key=self.connections.get)[:-MAX_STRANGERS]
        for stranger in crowd:  # many connections that say nothing: the oldest go, the newest get their chance
            stranger.drop()
        thread = threading.Thread(target=self._serve_connection, args=(conn,), name=f"connection {conn.address}",
                                  daemon=True)
        thread.start()
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]

    def _close_connections(self) -> None:
        """Send what is queued (briefly), then drop every connection and wait, briefly, for their threads."""
        with self.connections_lock:
            connections = list(self.connections)
        deadline = time.monotonic() + STOP_WAIT / 2
        for conn in connections:
            conn.outbox.put(None)  # the writer sends what is queued, then ends
        for conn in connections:
            conn.writer.join(max(0.0, deadline - time.monotonic()))
            conn.drop()
        deadline = time.monotonic() + STOP_WAIT / 2
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # ---- one connection ----

    def _serve_connection(self, conn: Connection) -> None:
        try:
            if not self._authenticate(conn):
                return
            with self.slot:
                free = self.slot.wait_for(lambda: self.active is None, BUSY_WAIT)
                if free:
                    self.active = conn
            if not free:
                conn.error(0, protocol.BUSY, "another client is connected and the backend serves one client at a "
                           "time; close that client first")
                return
            try:
                self._welcome(conn)
                self._request_loop(conn)
            finally:
                dropped = self.engine.drop_renders(conn)  # nobody waits for them now
                if dropped:
                    log(f"{conn.address}: closed with {dropped} render(s) waiting; they are dropped")
                try:
                    if conn.shared is not None:
                        conn.shared.close()
                finally:  # the next client gets the slot whatever closing the shared memory did
                    with self.slot:
                        self.active = None
                        self.engine.emit = lambda event: None
                        self.slot.notify_all()
        except Exception:  # a bug; this connection is lost but the server goes on
            traceback.print_exc()
        finally:
            with self.connections_lock:
                self.connections.pop(conn, None)
                self.strangers.discard(conn)
            conn.close()

    def _authenticate(self, conn: Connection) -> bool:
        """Read and check the hello; errors before it is accepted say nothing of the other messages."""
        host = conn.address.rsplit(":", 1)[0]
        try:
            message = protocol.read_message(conn.sock, {"hello": REQUESTS["hello"]}, protocol.MAX_HELLO_HEADER_BYTES,
                                            deadline=time.monotonic() + HELLO_TIMEOUT)
        except (protocol.ConnectionClosed, ConnectionError):
            return False
        except TimeoutError:
            conn.error(0, protocol.AUTH, f"no hello within {HELLO_TIMEOUT:.0f} s")
            return False
        except ProtocolError as e:
            conn.error(e.request_id, protocol.AUTH, FIRST_MESSAGE)
            return False
        except OSError:
            return False
        if self.wrong_tokens.refused(host):
            conn.error(message.id, protocol.AUTH, "too many wrong tokens from this address; wait a few seconds")
            return False
        token = message.fields["token"].encode("utf-8", "surrogatepass")  # any string compares, none raises
        if not hmac.compare_digest(token, self.token):
            self.wrong_tokens.failed(host)
            conn.error(message.id, protocol.AUTH, "wrong token; use the token in the file given to the "
                       "backend's --token-file")
            return False
        if message.fields["protocol"] != protocol.PROTOCOL_VERSION:
            conn.error(message.id, protocol.VERSION, f"the client speaks protocol {message.fields['protocol']} "
                       f"but this backend speaks {protocol.PROTOCOL_VERSION}; install matching versions of the "
                       "add-on and the backend")
            return False
        conn.sock.settimeout(None)
        with self.connections_lock:
            self.strangers.discard(conn)
        conn.hello = message
        return True

    def _welcome(self, conn: Connection) -> None:
        """Answer the accepted hello of the connection that now holds the client slot."""
        log(f"{conn.address}: {conn.hello.fields['client'] or 'a client'} connected")
        conn.shared = self._shared_frames(conn)
        conn.reply(conn.hello, {"protocol": protocol.PROTOCOL_VERSION, "server": "splatwright",
                                "shared_frames": conn.shared and conn.shared.wire(), **self.engine.status()})
        self.engine.emit = conn.event

    def _shared_frames(self, conn: Connection) -> SharedFrames | None:
        """Shared-memory frames for a client on this machine that asked for them, where this system has them."""
        host = conn.address.rsplit(":", 1)[0]
        if not (conn.hello.fields["shared_frames"] and protocol.is_loopback(host) and shared_frames.available()):
            return None
        try:
            return SharedFrames(self.engine.limits.render_pixels, self.engine.device == "cuda")
        except OSError as e:
            log(f"{conn.address}: frames go through the socket: cannot make a shared-memory file ({e})")
            return None

    def _request_loop(self, conn: Connection) -> None:
        while not conn.closed:  # a dropped connection's requests already received are not answered
            try:
                message = protocol.read_message(conn.sock, REQUESTS)
            except (protocol.ConnectionClosed, OSError):
                return
            except ProtocolError as e:
                log(f"{conn.address}: {e.message}")
                conn.error(e.request_id, e.code, e.message)
                if e.fatal:
                    return
                continue
            if message.type == "shutdown":
                self.engine.stop()
                conn.reply(message, self.engine.status())
                self.stop()
                return
            if message.type == "render":
                self._submit_render(conn, message)
            else:
                self._dispatch(conn, message)

    def _dispatch(self, conn: Connection, message: Message) -> None:
        try:
            if message.type in self.connection_handlers:
                fields, payload = self.connection_handlers[message.type](conn, message)
            else:
                fields, payload = self.handlers[message.type](message)
            conn.reply(message, fields, payload)  # checks the fields against protocol.REPLIES
        except SplatwrightError as e:
            conn.error(message.id, protocol.REJECTED, str(e))
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            conn.error(message.id, protocol.OUT_OF_MEMORY, f"the GPU ran out of memory during {message.type}; "
                       "lower max_gaussians or the image size, or close other programs using the GPU")
        except Exception as e:  # a bug; report it and keep serving
            traceback.print_exc()
            conn.error(message.id, protocol.INTERNAL, f"{message.type} failed: {e!r}; see the backend's log")

    def _submit_render(self, conn: Connection, message: Message) -> None:
        if message.fields["shared"] and conn.shared is None:
            conn.error(message.id, protocol.REJECTED, "this connection has no shared-memory frames: ask for them in "
                       "the hello (a client on the backend's machine, where /dev/shm exists) or render without "
                       "shared")
            return
        self.engine.submit_render(RenderJob(
            message.fields["camera"], message.fields["format"], message.fields["depth"],
            done=lambda fields, payload: conn.reply(message, fields, payload),
            fail=lambda code, text: conn.error(message.id, code, text),
            model=message.fields["model"], crop=message.fields["crop"], time=message.fields["time"],
            owner=conn, stream=message.fields["stream"], shared=conn.shared if message.fields["shared"] else None))

    # ---- handlers that decode payloads ----

    def _hello_again(self, message: Message):
        raise SplatwrightError("this connection is already authenticated; send hello only once")

    def _release_frame(self, conn: Connection, message: Message):
        if conn.shared is None:
            raise SplatwrightError("this connection has no shared-memory frames to release; ask for them in the "
                                   "hello (shared_frames) and render with shared before releasing a slot")
        conn.shared.release(message.fields["slot"])
        return {}, b""

    def _reconstruct(self, conn: Connection, message: Message):
        local = protocol.is_loopback(conn.address.rsplit(":", 1)[0])  # only such a client may name a path here
        return self.engine.reconstructions.start(message.fields["capture"], message.fields["path"],
                                                 message.fields["rate"], local), b""

    def _add_view(self, message: Message):
        camera = message.fields["camera"]
        self.engine.check_view(camera)  # before decoding: the image may be large
        image = decode_upload(message.fields["format"], message.payload, camera.width, camera.height)
        return self.engine.add_view(camera, image, message.fields["name"], message.fields["time"]), b""

    def _set_points(self, message: Message):
        try:
            xyz, rgb = codecs.points_from_wire(message.payload, message.fields["count"])
        except ValueError as e:
            raise SplatwrightError(str(e)) from None
        return self.engine.set_points(xyz, rgb), b""


def read_token(path: str | None) -> str:
    if path is None:
        return ""
    try:
        token = Path(path).read_text(encoding="utf-8-sig").strip()  # without the BOM some editors write
    except (OSError, UnicodeDecodeError) as e:
        raise SplatwrightError(f"--token-file {path}: cannot read it ({e})") from None
    if not token:
        raise SplatwrightError(f"--token-file {path} is empty; put a long random secret in it")
    if len(token) > protocol.MAX_TOKEN_CHARS:
        raise SplatwrightError(f"--token-file {path}: token longer than {protocol.MAX_TOKEN_CHARS} characters")
    return token


# How long a thread holding the GIL keeps it while another asks for it (Python's default is 5 ms). The training
# thread is busy in Python all the time; a frame passes through the socket, render and reply threads, each
# waiting its turn for the GIL, so at the default a frame waits for training several times 5 ms.
GIL_SWITCH_SECONDS = 0.0002


def _warm_up() -> None:
    """Build or load the kernels and run each once while no one waits, so that the first training starts at
    full speed; a failure here is reported again by the training that meets it."""
    try:
        log(f"kernels ready ({warm_up():.1f} s)")
    except Exception as e:  # the build's or the GPU's error, which the first training reports to its client
        log(f"warming up the kernels failed: {e}")


def serve(args) -> int:
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    if shared_frames.available():
        shared_frames.remove_stale_files()
    token = read_token(args.token_file)
    if not protocol.is_loopback(args.host) and not token:
        raise SplatwrightError(f"--host {args.host} is reachable from other machines; refusing to serve without "
                               "a token: pass --token-file with a secret, or serve on 127.0.0.1")
    device, rasterizer = resolve_device(args.device, build=False)  # the warm-up builds the kernels after 'ready'
    if args.gpus > 1:
        check_gpus(args.gpus, args.device)
    workdir = Path(args.workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SplatwrightError(f"--workdir {workdir}: cannot make the folder ({e.strerror or e})") from None
    limits = Limits(**{f.name: getattr(args, "max_" + f.name) for f in fields(Limits)})
    try:
        server = Server(Engine(workdir, device, rasterizer, limits, args.gpus, args.parallel), args.host, args.port,
                        token)
    except OSError as e:
        raise SplatwrightError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); pass another "
                               "--port (0: a free one)") from None
    signal.signal(signal.SIGTERM, lambda signum, frame: server.stop())
    if args.exit_with_parent:
        watch_parent(server)
    print(json.dumps({"event": "ready", "port": server.port, "protocol": protocol.PROTOCOL_VERSION}), flush=True)
    processes = f", training in {args.gpus} processes ({args.parallel} parallel)" if args.gpus > 1 else ""
    log(f"listening on {args.host}:{server.port}, {device} ({rasterizer} rasterizer){processes}, sessions in "
        f"{workdir}")
    if device == "cuda":
        threading.Thread(target=_warm_up, name="warm-up", daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log("interrupted")
    if not server.rendering_done:
        # A long CPU render cannot be interrupted; the checkpoint is written, so end without waiting for it.
        log("stopped; a render still running is abandoned")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def watch_parent(server: Server) -> None:
    """Stop (checkpointing, as on SIGTERM) once the process that started this server is gone, however it ended: a
    Blender that crashed or was killed too.

    That process gives the server a pipe as its stdin and keeps the other end without ever writing to it. When it
    ends, the system closes its end, whatever ended it, and reading stdin returns end-of-file at once. Unlike
    Linux's PR_SET_PDEATHSIG, which fires when the *thread* that started the child ends, this does not depend on
    which thread that was; unlike the parent's pid, which a new process may take, it cannot mistake another process
    for the parent; and it works on Windows, which never re-parents a process (and where a venv's launcher process
    stands between the two). As a second watch, for a parent that gave no pipe (a shell's background job reads
    /dev/null) or whose pipe a child of its own still holds open, the parent's pid is read every second: a POSIX
    system hands an orphan to another parent, which changes it."""
    try:
        piped = stat.S_ISFIFO(os.fstat(0).st_mode)
    except OSError:  # no stdin at all
        piped = False
    if piped:
        threading.Thread(target=_stop_at_end_of_stdin, args=(server,), name="parent-pipe", daemon=True).start()
    threading.Thread(target=_stop_when_orphaned, args=(server,), name="parent-pid", daemon=True).start()


def _stop_at_end_of_stdin(server: Server) -> None:
    try:
        while os.read(0, 4096):  # what a parent might write means nothing
            pass
    except OSError as e:
        log(f"cannot read the pipe from the process that started this backend ({e}); watching its pid alone")
        return
    _parent_gone(server, "closed the pipe it gave this backend")


def _stop_when_orphaned(server: Server) -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    _parent_gone(server, "is gone")


def _parent_gone(server: Server, how: str) -> None:
    if not server.stopping.is_set():
        log(f"the process that started this backend {how}; stopping")
        server.stop()

"""The backend server: `python -m backend serve`.

TCP on loopback by default (anywhere else only with a token), one client at a time. Each connection has a
reader (this module: frames in, requests dispatched) and a writer thread (frames out from a queue), so
neither training nor a slow client ever blocks reading the socket. The Engine (engine.py) owns the model.
"""
from __future__ import annotations

import hmac
import json
import os
import queue
import signal
import socket
import threading
import time
import traceback
from pathlib import Path

import torch

from blender_addon.core import codecs, protocol
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import REQUESTS, SERVER_MESSAGES, Message, ProtocolError
from .engine import Engine, RenderJob, log
from .frames import decode_upload
from .policy import resolve_device

HELLO_TIMEOUT = 10.0  # seconds a new connection has to authenticate
BUSY_WAIT = 1.0  # a reconnecting client may arrive before its previous connection is torn down
DRAIN_TIMEOUT = 1.0
MAX_QUEUED_EVENTS = 64  # events beyond this are dropped while the client is not reading


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
        self.closed = False
        self.writer = threading.Thread(target=self._write_loop, name=f"write {self.address}", daemon=True)
        self.writer.start()

    def reply(self, request: Message, fields: dict, payload: bytes | memoryview = b"") -> None:
        if not self.closed:
            self.outbox.put(protocol.encode_reply(request.type, request.id, fields, payload))

    def error(self, request_id: int, code: str, message: str) -> None:
        self._send("error", request_id, {"code": code, "message": message[:protocol.MAX_TEXT_CHARS]})

    def event(self, fields: dict) -> None:
        if self.outbox.qsize() < MAX_QUEUED_EVENTS:
            self._send("event", 0, fields)

    def _send(self, type: str, request_id: int, fields: dict) -> None:
        if not self.closed:
            self.outbox.put(protocol.encode_message(SERVER_MESSAGES, type, request_id, fields))

    def _write_loop(self) -> None:
        broken = False
        while (parts := self.outbox.get()) is not None:
            if not broken:
                try:
                    protocol.send_message(self.sock, parts)
                except OSError:
                    broken = True  # the reader notices too; what is still queued is dropped
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
        self.engine, self.token = engine, token
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family)
        self.listener.settimeout(0.2)  # how often the accept loop checks for a stop request
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.slot = threading.Condition()
        self.active: Connection | None = None
        self.threads: list[threading.Thread] = []
        self.handlers = {
            "hello": self._hello_again, "capabilities": lambda m: (self.engine.capabilities(), b""),
            "status": lambda m: (self.engine.status(), b""),
            "open_session": lambda m: (self.engine.open_session(m.fields["name"], m.fields["create"]), b""),
            "add_view": self._add_view, "set_points": self._set_points,
            "start_training": lambda m: (self.engine.start_training(m.fields), b""),
            "pause": lambda m: (self.engine.pause(), b""), "resume": lambda m: (self.engine.resume(), b""),
            "stop": lambda m: (self.engine.stop(), b""),
            "export_ply": lambda m: self.engine.export_ply(),
            "save_checkpoint": lambda m: (self.engine.save_checkpoint(), b""),
            "load_checkpoint": lambda m: (self.engine.load_checkpoint(), b""),
            "load_ply": lambda m: (self.engine.load_ply(m.payload, m.fields["background"]), b""),
        }

    def serve_forever(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    sock, address = self.listener.accept()
                except TimeoutError:
                    continue
                thread = threading.Thread(target=self._serve_connection, args=(sock, address),
                                          name=f"connection {address[0]}:{address[1]}", daemon=True)
                thread.start()
                self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        finally:
            self.listener.close()
            self.engine.close()
            for thread in self.threads:  # let the last replies go out
                thread.join(DRAIN_TIMEOUT + 1)

    def stop(self) -> None:
        self.stopping.set()

    # ---- one connection ----

    def _serve_connection(self, sock: socket.socket, address: tuple) -> None:
        conn = Connection(sock, address)
        try:
            with self.slot:
                free = self.slot.wait_for(lambda: self.active is None, BUSY_WAIT)
                if free:
                    self.active = conn
            if not free:
                conn.error(0, protocol.BUSY, "another client is connected and the backend serves one client at a "
                           "time; close that client first")
                return
            try:
                if self._authenticate(conn):
                    self._request_loop(conn)
            finally:
                with self.slot:
                    self.active = None
                    self.engine.emit = lambda event: None
                    self.slot.notify_all()
        except Exception:  # a bug; this connection is lost but the server goes on
            traceback.print_exc()
        finally:
            conn.close()

    def _authenticate(self, conn: Connection) -> bool:
        conn.sock.settimeout(HELLO_TIMEOUT)
        try:
            message = protocol.read_message(conn.sock, REQUESTS)
        except protocol.ConnectionClosed:
            return False
        except TimeoutError:
            conn.error(0, protocol.AUTH, f"no hello within {HELLO_TIMEOUT:.0f} s")
            return False
        except ProtocolError as e:
            conn.error(e.request_id, e.code, e.message)
            return False
        except OSError:
            return False
        if message.type != "hello":
            conn.error(message.id, protocol.AUTH, "the first message must be hello with the token and protocol "
                       "version")
            return False
        if not hmac.compare_digest(message.fields["token"].encode(), self.token.encode()):
            log(f"{conn.address}: wrong token")
            conn.error(message.id, protocol.AUTH, "wrong token; use the token in the file given to the "
                       "backend's --token-file")
            return False
        if message.fields["protocol"] != protocol.PROTOCOL_VERSION:
            conn.error(message.id, protocol.VERSION, f"the client speaks protocol {message.fields['protocol']} "
                       f"but this backend speaks {protocol.PROTOCOL_VERSION}; install matching versions of the "
                       "add-on and the backend")
            return False
        conn.sock.settimeout(None)
        log(f"{conn.address}: {message.fields['client'] or 'a client'} connected")
        conn.reply(message, {"protocol": protocol.PROTOCOL_VERSION, "server": "splatwright",
                             **self.engine.status()})
        self.engine.emit = conn.event
        return True

    def _request_loop(self, conn: Connection) -> None:
        while True:
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
        self.engine.submit_render(RenderJob(
            message.fields["camera"], message.fields["format"], message.fields["depth"],
            done=lambda fields, payload: conn.reply(message, fields, payload),
            fail=lambda code, text: conn.error(message.id, code, text)))

    # ---- handlers that decode payloads ----

    def _hello_again(self, message: Message):
        raise SplatwrightError("this connection is already authenticated; send hello only once")

    def _add_view(self, message: Message):
        camera = message.fields["camera"]
        image = decode_upload(message.fields["format"], message.payload, camera.width, camera.height)
        return self.engine.add_view(camera, image, message.fields["name"]), b""

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
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise SplatwrightError(f"--token-file {path}: cannot read it ({e})") from None
    if not token:
        raise SplatwrightError(f"--token-file {path} is empty; put a long random secret in it")
    if len(token) > protocol.MAX_TOKEN_CHARS:
        raise SplatwrightError(f"--token-file {path}: token longer than {protocol.MAX_TOKEN_CHARS} characters")
    return token


def serve(args) -> int:
    token = read_token(args.token_file)
    if not protocol.is_loopback(args.host) and not token:
        raise SplatwrightError(f"--host {args.host} is reachable from other machines; refusing to serve without "
                               "a token: pass --token-file with a secret, or serve on 127.0.0.1")
    device, rasterizer = resolve_device(args.device)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        server = Server(Engine(workdir, device, rasterizer), args.host, args.port, token)
    except OSError as e:
        raise SplatwrightError(f"cannot listen on {args.host}:{args.port} ({e})") from None
    signal.signal(signal.SIGTERM, lambda signum, frame: server.stop())
    if args.exit_with_parent:
        threading.Thread(target=_stop_when_orphaned, args=(server,), name="parent-watch", daemon=True).start()
    print(json.dumps({"event": "ready", "port": server.port, "protocol": protocol.PROTOCOL_VERSION}), flush=True)
    log(f"listening on {args.host}:{server.port}, {device} ({rasterizer} rasterizer), sessions in {workdir}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log("interrupted")
    return 0


def _stop_when_orphaned(server: "Server") -> None:
    """Stop (checkpointing, as on SIGTERM) once the process that started us is gone, e.g. a killed Blender:
    the system then re-parents us, which changes our parent's pid."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1.0)
    log("the process that started this backend is gone; stopping")
    server.stop()

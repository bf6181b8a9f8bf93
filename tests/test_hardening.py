"""The server against hostile or unlucky peers and machines, through the real socket (CPU): strangers that never
authenticate, sizes that are declared but not sent, images that lie about their size, work that would hold the
model for minutes, signals during long work, accept() failing, files a power loss left behind, a folder that
cannot be written, renders nobody waits for, a parent killed under the backend, imports piling up on the disk;
the command line's one-line errors, and its sequence exports killed half-way."""
from __future__ import annotations

import gzip
import importlib.util
import inspect
import io
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from blender_addon.core import codecs, protocol
from blender_addon.core.client import Client, RemoteError
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import REQUESTS
from blender_addon.core.settings import training_settings
from blender_addon.core import colmap
from blender_addon.core.files import sequence_paths, sequence_state
from backend import formats
from backend.formats.budget import Budget
from backend.tools import cli
from backend.gaussians import Gaussians, _nearest_neighbour_distance
from backend.formats.ply import encode_ply, write_ply
from backend.service.server import FIRST_MESSAGE, read_token
from backend.service.session import Session
from backend.train import load_checkpoint, previous_checkpoint
from helpers import (ROOT, assert_bombs_refused, assert_same_model, cli_memory, gzip_of_zeros, moving_model,
                     orbit_cameras, random_gaussians, spz_column_bytes, spz_of_zeros, write_capture,
                     zstd_spz_of_zeros)
from server_helpers import (SIZE, add_scene_views, png_bytes, process_running, raw_connect, read_until_closed,
                            wait_for)


def png_declaring(width: int, height: int, rows: int) -> bytes:
    """A well-formed RGB PNG whose header says width x height but whose data holds only `rows` rows (of zeros):
    decoders that do not check fill the rest with zeros."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = zlib.compress(bytes(rows * (1 + width * 3)), 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def sphere_points(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n points on a sphere's surface, as a capture samples meshes, and their colours."""
    rng = np.random.default_rng(seed)
    xyz = rng.normal(size=(n, 3))
    xyz /= np.linalg.norm(xyz, axis=1, keepdims=True)
    return xyz.astype(np.float32), rng.integers(0, 256, (n, 3), dtype=np.uint8)


def exit_seconds(server, sig=signal.SIGTERM, timeout: float = 60.0) -> float:
    start = time.monotonic()
    server.proc.send_signal(sig)
    server.proc.wait(timeout)
    return time.monotonic() - start


# ---- authentication first ----

def test_strangers_never_keep_a_client_out(tmp_path, start_server):
    """While one connection trickles a byte a second and 50 others say nothing (each reconnecting when
    dropped), a real client gets its hello answered every time."""
    server = start_server(tmp_path / "work")
    stop = threading.Event()

    def stranger(trickle: bool) -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                    for byte in protocol.MAGIC + b"\x00\x00\x10\x00" * 100:
                        if stop.wait(1.0 if trickle else 0.2):
                            return
                        if trickle:
                            sock.sendall(bytes([byte]))
            except OSError:
                pass  # dropped by the server: come back
    strangers = [threading.Thread(target=stranger, args=(i == 0,), daemon=True) for i in range(51)]
    for thread in strangers:
        thread.start()
    time.sleep(1.0)
    latencies = []
    try:
        for _ in range(20):
            start = time.monotonic()
            with Client("127.0.0.1", server.port, timeout=10) as client:
                latencies.append(time.monotonic() - start)
                assert client.hello["server"] == "splatwright"
    finally:
        stop.set()
    print(f"hello answered 20 of 20 times; median {statistics.median(latencies) * 1000:.0f} ms, "
          f"slowest {max(latencies) * 1000:.0f} ms")
    assert statistics.median(latencies) < 1.0


def test_before_hello_nothing_but_a_small_hello_is_read(tmp_path, start_server):
    server = start_server(tmp_path / "work")
    before = server.rss()
    for type in ("load_ply", "hello"):  # the largest payload declared, none of it sent
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(protocol.encode_header(type, 1, {}, protocol.MAX_PAYLOAD_BYTES))
            [error] = read_until_closed(sock)
        assert error.fields["code"] == "auth" and error.fields["message"] == FIRST_MESSAGE
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # a header over hello's cap
        sock.sendall(protocol.PREFIX.pack(protocol.MAGIC, protocol.MAX_HELLO_HEADER_BYTES + 1))
        [error] = read_until_closed(sock)
    assert error.fields["code"] == "auth"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # no schema detail
        sock.sendall(protocol.encode_header("hello", 3, {"token": 5, "protocol": "x", "secret": 1}, 0))
        [error] = read_until_closed(sock)
    assert error.id == 3 and error.fields["message"] == FIRST_MESSAGE  # the same whatever was wrong
    # After hello: a size declared but not sent costs nothing either.
    with raw_connect(server.port) as sock:
        camera = codecs.camera_to_wire(orbit_cameras(1, 8192, 8192)[0])
        sock.sendall(protocol.encode_header("add_view", 2, {"camera": camera, "format": "rgba16f"},
                                            codecs.MAX_IMAGE_BYTES) + b"x")
        time.sleep(1.0)
        grown = server.rss() - before
    print(f"RSS grew {grown / 2**20:.1f} MiB")
    assert grown < 16 * 2**20


def test_wrong_tokens_are_rate_limited_and_odd_tokens_answered(tmp_path, start_server):
    (tmp_path / "token").write_bytes("\ufeffs3cret\n".encode("utf-8"))  # a BOM, as some editors write
    assert read_token(str(tmp_path / "token")) == "s3cret"
    server = start_server(tmp_path / "work", "--token-file", str(tmp_path / "token"))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # a lone surrogate
        sock.sendall(protocol.encode_header("hello", 1, {"token": "\ud800", "protocol": protocol.PROTOCOL_VERSION}, 0))
        [error] = read_until_closed(sock)
    assert error.fields["code"] == "auth" and "wrong token" in error.fields["message"]
    refused = 0
    for _ in range(40):
        with pytest.raises(RemoteError) as e:
            server.client("wrong")
        refused += "too many wrong tokens" in e.value.message
    assert refused >= 20
    assert server.log().count("wrong token") == 1  # one line for the whole burst
    time.sleep(1.5)  # the allowance comes back
    with server.client("s3cret") as client:
        assert client.call("status")["state"] == "idle"


# ---- sizes ----

def test_images_are_checked_before_they_are_decoded(tmp_path, start_server, scene):
    server = start_server(tmp_path / "work", "--max-session-pixels", str(SIZE * SIZE + 1),
                          "--max-render-pixels", str(SIZE * SIZE), "--max-points", "100")
    before = server.rss()
    big = orbit_cameras(1, 8192, 8192)[0]
    with server.client() as client:
        client.call("open_session", name="sizes")
        truncated = png_declaring(8192, 8192, 1)
        assert len(truncated) == 104
        for _ in range(4):  # four all-zero 8192x8192 PNGs of 104 bytes each
            with pytest.raises(RemoteError, match="--max-view-pixels") as e:
                client.add_view(big, truncated)
            assert e.value.code == "rejected"
        with pytest.raises(RemoteError, match="no views yet"):
            client.call("start_training")
        small = orbit_cameras(1, SIZE, SIZE)[0]
        with pytest.raises(RemoteError, match="truncated"):
            client.add_view(small, png_declaring(SIZE, SIZE, 3))
        add_scene_views(client, scene, 1)
        with pytest.raises(RemoteError, match="--max-session-pixels"):
            client.add_view(scene[1][1], png_bytes(scene[2][1]))
        with pytest.raises(RemoteError, match="--max-points"):
            client.set_points(np.zeros((101, 3), np.float32), np.zeros((101, 3), np.uint8))
        with pytest.raises(RemoteError, match="--max-points"):
            client.call("start_training", init_points=101)
        write_ply(tmp_path / "model.ply", scene[0])
        client.load_ply((tmp_path / "model.ply").read_bytes())
        assert client.render(small).shape == (SIZE, SIZE, 4)
        with pytest.raises(RemoteError, match="--max-render-pixels"):
            client.render(small.scaled(2))
    assert server.rss() - before < 2**30


def test_a_client_that_never_reads_is_dropped(tmp_path, start_server, scene):
    server = start_server(tmp_path / "work")
    model = random_gaussians(20_000, seed=2, sh_degree=3)  # a 5 MB PLY per export reply
    write_ply(tmp_path / "model.ply", model)
    ply = (tmp_path / "model.ply").read_bytes()
    before = server.rss()
    with raw_connect(server.port) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        protocol.send_message(sock, protocol.encode_message(REQUESTS, "load_ply", 2, {}, ply))
        try:
            for i in range(120):  # 600 MB of replies if they were all kept
                protocol.send_message(sock, protocol.encode_message(REQUESTS, "export_ply", 3 + i))
        except OSError:
            pass  # dropped while we were still asking
        deadline = time.monotonic() + 60
        while "replies unread" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert "replies unread; dropping the connection" in server.log()
    assert server.rss() - before < 600 * 2**20
    with server.client() as client:
        assert client.call("status")["gaussians"] == 20_000


# ---- long work off the request path, and stopping it ----

def train_from_a_million_points(client, scene, name: str) -> tuple[float, float]:
    """Open session `name` with two views and 1M initial points and start training: (seconds set_points took,
    seconds start_training took)."""
    client.call("open_session", name=name)
    add_scene_views(client, scene, 2)
    start = time.monotonic()
    assert client.set_points(*sphere_points(1_000_000))["points"] == 1_000_000
    stored = time.monotonic() - start
    client.call("start_training", sh_degree=0, max_gaussians=0, checkpoint_seconds=0, progress_interval=60)
    return stored, time.monotonic() - start - stored


def test_one_million_points_are_set_up_on_the_training_thread(tmp_path, start_server, scene):
    server = start_server(tmp_path / "work")
    with server.client() as client:
        stored, started = train_from_a_million_points(client, scene, "million")
        start = time.monotonic()
        latencies = []
        while True:
            asked = time.monotonic()
            status = client.call("status")
            latencies.append(time.monotonic() - asked)
            if status["gaussians"]:
                break
            assert time.monotonic() - start < 120, "the set-up of 1M points did not finish"
            time.sleep(0.05)
        set_up = time.monotonic() - start
        assert status["gaussians"] == 1_000_000
    print(f"set_points {stored:.2f} s, start_training {started:.2f} s, set-up {set_up:.1f} s, status median "
          f"{statistics.median(latencies) * 1000:.0f} ms over {len(latencies)}")
    assert statistics.median(latencies) < 0.5


def test_sigterm_stops_the_set_up_and_a_long_render(tmp_path, start_server, scene):
    server = start_server(tmp_path / "work")
    with server.client() as client:
        train_from_a_million_points(client, scene, "setup")
        time.sleep(0.5)
        during_set_up = exit_seconds(server)
    assert server.proc.returncode == 0

    server = start_server(tmp_path / "work")
    with server.client() as client:
        client.call("open_session", name="render")
        add_scene_views(client, scene)
        client.call("start_training", iterations=100_000, init_points=300, checkpoint_seconds=0, progress_interval=0.05)
        step = wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= 5)["step"]
        client.submit_render(scene[1][0].scaled(4096 / SIZE))
        time.sleep(1.0)
        assert client.call("status")["state"] == "training"  # the render holds no lock
        during_render = exit_seconds(server)
    assert server.proc.returncode == 0
    assert load_checkpoint(tmp_path / "work" / "render" / "checkpoint.pt")["step"] >= step
    print(f"SIGTERM: {during_set_up:.2f} s during the set-up of 1M points, {during_render:.2f} s during a "
          "4096x4096 CPU render")
    assert during_set_up < 10 and during_render < 10


def test_accept_failing_for_want_of_file_descriptors_is_survived(tmp_path, start_server):
    def few_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    server = start_server(tmp_path / "work", preexec_fn=few_files)
    socks = []
    for _ in range(80):
        socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
    deadline = time.monotonic() + 30
    while "cannot accept connections" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "cannot accept connections" in server.log()
    for sock in socks:
        sock.close()
    deadline = time.monotonic() + 30
    while True:
        try:
            with server.client() as client:
                assert client.call("status")["state"] == "idle"
            break
        except (OSError, RemoteError):
            assert time.monotonic() < deadline and server.proc.poll() is None
            time.sleep(0.2)
    assert server.proc.poll() is None


# ---- durable files ----

def test_a_removed_sessions_folder_is_made_again_by_a_new_session(tmp_path):
    """The sessions folder removed while the server runs: opening an existing session says there is none,
    and creating one makes the folder again."""
    workdir = tmp_path / "sessions"
    with pytest.raises(SplatwrightError, match="no session 'kept'"):
        Session.open(workdir, "kept", create=False)
    session = Session.open(workdir, "kept", create=True)
    assert (workdir / "kept" / "views").is_dir() and session.name == "kept"


def test_a_session_opens_with_what_a_power_loss_left(tmp_path, start_server, scene):
    """An empty checkpoint.pt (the previous one intact), an empty view file and stray temporary files: the
    session opens without them, says what it skipped, and resumes from the previous checkpoint."""
    workdir = tmp_path / "work"
    server = start_server(workdir)
    with server.client() as client:
        client.call("open_session", name="lossy")
        add_scene_views(client, scene)
        client.call("start_training", iterations=100_000, checkpoint_every=10, checkpoint_seconds=0,
                    progress_interval=0.05, init_points=200)
        wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= 25)
        client.call("stop")
        client.call("shutdown")
    server.proc.wait(30)
    folder = workdir / "lossy"
    previous = load_checkpoint(previous_checkpoint(folder / "checkpoint.pt"))["step"]
    (folder / "checkpoint.pt").write_bytes(b"")
    (folder / "views" / "000002.npy").write_bytes(b"")
    (folder / "views" / "000004.npy.tmp").write_bytes(b"half")
    (folder / "splats.ply.tmp").write_bytes(b"half")

    server = start_server(workdir)
    with server.client() as client:
        opened = client.call("open_session", name="lossy", create=False)
        warnings = []
        for event in client.events(timeout=2):
            if event["event"] == "warning":
                warnings.append(event["message"])
        assert opened["views"] == 3 and opened["checkpoint"]
        text = "\n".join(warnings)
        assert "lossy/views/000002" in text and "lossy/views/000004.npy.tmp" in text
        assert "lossy/checkpoint.pt is unreadable" in text and str(tmp_path) not in text
        assert not list(folder.rglob("*.tmp"))
        assert client.call("start_training")["continued"]
        resumed = wait_for(client, lambda e: e["event"] == "state" and e["gaussians"] > 0)
        assert resumed["step"] == previous
        added = client.add_view(scene[1][5], png_bytes(scene[2][5]))  # after the skipped file, not over it
        assert added["views"] == 4 and (folder / "views" / "000004.json").is_file()
        assert (folder / "views" / "000002.npy").stat().st_size == 0
        client.call("stop")


def test_writes_that_fail_are_rejected_with_the_file_and_the_reason(tmp_path, start_server, scene):
    workdir = tmp_path / "work"
    server = start_server(workdir)
    with server.client() as client:
        client.call("open_session", name="blocked")
        add_scene_views(client, scene, 2)
        client.call("start_training", iterations=100_000, init_points=200, checkpoint_seconds=0,
                    progress_interval=0.05)
        wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= 2)
        client.call("pause")
        folder = workdir / "blocked"
        # What a read-only folder or a full disk does to a write: the temporary file cannot be made.
        for name in ("views/000002.npy.tmp", "points3d.ply.tmp", "splats.ply.tmp", "checkpoint.pt.tmp"):
            (folder / name).mkdir()
        for request, match in ((lambda: client.add_view(scene[1][2], png_bytes(scene[2][2])), "blocked/views/000002"),
                               (lambda: client.set_points(*sphere_points(10)), "blocked/points3d.ply"),
                               (lambda: client.request("export_ply"), "blocked/splats.ply"),
                               (lambda: client.call("save_checkpoint"), "checkpoint.pt")):
            with pytest.raises(RemoteError, match=match) as e:
                request()
            assert e.value.code == "rejected" and "directory" in e.value.message.lower()
            assert str(tmp_path) not in e.value.message
        assert client.call("status")["views"] == 2
        client.call("resume")
        client.call("stop")  # its checkpoint fails too: reported, and the server goes on
        assert client.call("status")["state"] == "stopped"


# ---- checkpoints by time, and a fresh start that loses nothing ----

def test_checkpoints_by_time_and_a_fresh_start_keeps_the_old_model_until_its_first(tmp_path, start_server, scene):
    workdir = tmp_path / "work"
    checkpoint = workdir / "timed" / "checkpoint.pt"
    server = start_server(workdir)
    with server.client() as client:
        client.call("open_session", name="timed")
        add_scene_views(client, scene)
        client.call("start_training", iterations=100_000, init_points=200, checkpoint_every=0,
                    checkpoint_seconds=0.2, progress_interval=0.05)
        deadline = time.monotonic() + 60
        while not checkpoint.is_file():  # no step count asks for it: elapsed training time does
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert client.call("status")["state"] == "training"
        wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= 40)
        old = client.call("stop")["step"]
        assert load_checkpoint(checkpoint)["step"] == old

        started = client.call("start_training", fresh=True, iterations=100_000, init_points=200,
                              checkpoint_every=0, checkpoint_seconds=3600, progress_interval=0.05)
        assert not started["continued"] and started["checkpoint"]
        # The stopped run's last events may still be queued: first the new run's trainer, set up at step 0.
        wait_for(client, lambda e: e["event"] == "state" and e["state"] == "training" and e["step"] == 0)
        wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= 5)
        paused = client.call("pause")["step"]
        assert paused < old and load_checkpoint(checkpoint)["step"] == old  # the old model stays meanwhile
        assert client.call("save_checkpoint")["step"] == paused
        assert load_checkpoint(checkpoint)["step"] == paused  # the new run's first checkpoint replaced it
        client.call("stop")


def test_checkpoint_seconds_in_the_command_line_loop(tiny_scene, tmp_path, monkeypatch):
    from backend.tools.commands import run_training
    from backend.data import load_split
    from backend.policy import make_config
    from backend.train import Trainer
    trainer = Trainer(load_split(tiny_scene, "train"), make_config("cpu", "reference", training_settings(iterations=40, init_points=50)),
                      "cpu")
    saved, save = [], Trainer.save_checkpoint

    def counted(self, path):
        saved.append(self.step)
        save(self, path)
    monkeypatch.setattr(Trainer, "save_checkpoint", counted)
    clock = iter(range(10**6))
    monkeypatch.setattr("backend.train.time.perf_counter", lambda: next(clock) * 0.5)  # each step takes 0.5 s
    run_training(trainer, tmp_path / "checkpoint.pt", 0, 2.0)
    assert saved == list(range(4, 41, 4)) + [40]  # every 2 s of training, and at the end


# ---- the neighbour search ----

@pytest.mark.parametrize("kind", ["uniform", "surface", "clusters", "duplicates", "line", "strays"])
def test_neighbour_search_is_exact(kind):
    gen = torch.Generator().manual_seed(3)
    for n in (2, 3, 4, 50, 2000):
        if kind == "uniform":
            points = torch.rand(n, 3, generator=gen)
        elif kind == "surface":
            points = torch.nn.functional.normalize(torch.randn(n, 3, generator=gen), dim=1)
        elif kind == "clusters":  # tight clusters far apart
            points = torch.randn(n, 3, generator=gen) * 1e-3 + (torch.rand(n, 1, generator=gen) > 0.9) * 100.0
        elif kind == "duplicates":
            points = torch.randint(0, 3, (n, 3), generator=gen).float()
        elif kind == "strays":  # a cloud and three points far from it and from each other, as SfM leaves some
            points = torch.rand(n, 3, generator=gen)
            points[-3:] = torch.tensor([[100.0, 0.0, 0.0], [0.0, -250.0, 0.0], [0.0, 0.0, 400.0]])[-min(n, 3):]
        else:
            points = torch.zeros(n, 3)
            points[:, 0] = torch.rand(n, generator=gen) ** 3
        d = torch.cdist(points, points, compute_mode="donot_use_mm_for_euclid_dist")
        d.fill_diagonal_(float("inf"))
        expected = d.topk(min(3, n - 1), largest=False).values.square().mean(dim=1).sqrt()
        assert torch.allclose(_nearest_neighbour_distance(points), expected, rtol=1e-4, atol=1e-6), (kind, n)


def test_gaussians_from_one_two_or_three_points():
    points = torch.tensor([[0.0, 0.0, 0.0], [3.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
    expected = {1: [0.01], 2: [3.0, 3.0], 3: [(12.5 ** 0.5), (17.0 ** 0.5), (20.5 ** 0.5)]}
    for n, scales in expected.items():
        assert torch.allclose(_nearest_neighbour_distance(points[:n]), torch.tensor(scales)), n
        g = Gaussians.from_points(points[:n], torch.full((n, 3), 0.5), 0)
        assert len(g) == n and torch.allclose(g.log_scales, torch.log(torch.tensor(scales))[:, None].expand(n, 3))


def test_neighbour_search_stops_when_asked():
    with pytest.raises(InterruptedError):
        _nearest_neighbour_distance(torch.rand(100_000, 3), cancelled=lambda: True)


# ---- the command line: one line, no traceback ----

def _transforms(folder: Path, scene_dir: Path, edit) -> Path:
    meta = json.loads((scene_dir / "transforms_train.json").read_text())
    edit(meta)
    path = folder / "transforms_train.json"
    path.write_text(json.dumps(meta))
    for png in (scene_dir / "train").glob("*.png"):
        (folder / "train").mkdir(exist_ok=True)
        (folder / "train" / png.name).write_bytes(png.read_bytes())
    return path


def _set(key, value):
    def edit(meta):
        meta[key] = value
    return edit


def _frame(key, value):
    def edit(meta):
        meta["frames"][0][key] = value
    return edit


def _first_frame(value):
    def edit(meta):
        meta["frames"][0] = value
    return edit


CAMERA_FILE_BREAKAGES = {
    "frame is a number": _first_frame(5), "frame is a string": _first_frame("r_0"),
    "ragged matrix": _frame("transform_matrix", [[1, 0, 0, 0], [0, 1, 0]]),
    "string matrix": _frame("transform_matrix", "eye"),
    "camera_angle_x string": _set("camera_angle_x", "wide"),
    "fl_x string": _set("fl_x", "50"), "fl_x NaN": _set("fl_x", float("nan")), "fl_x 0": _set("fl_x", 0),
    "fl_x negative": _set("fl_x", -20.0),
}


@pytest.mark.parametrize("breakage", list(CAMERA_FILE_BREAKAGES))
def test_cli_refuses_bad_camera_files_in_one_line(breakage, tiny_scene, tmp_path, capsys):
    scene_dir = tmp_path / "broken"
    scene_dir.mkdir()
    _transforms(scene_dir, tiny_scene, CAMERA_FILE_BREAKAGES[breakage])
    assert_one_error_line(capsys, "train", str(scene_dir), "--out", str(tmp_path / "out"), "--iters", "1")


def test_cli_refuses_bad_arguments_and_files_in_one_line(tiny_scene, tmp_path, capsys):
    out = str(tmp_path / "out")
    for flags in (["--iters", "0"], ["--iters", "-5"], ["--max-gaussians", "-1"], ["--init-points", "-1"]):
        assert_one_error_line(capsys, "train", str(tiny_scene), "--out", out, *flags)
    (tmp_path / "a_file").write_text("x")
    assert_one_error_line(capsys, "train", str(tiny_scene), "--out", str(tmp_path / "a_file"), "--iters", "1")

    bomb_dir = tmp_path / "bomb"  # a 20000x20000 PNG: a decompression bomb to Pillow
    bomb_dir.mkdir()
    _transforms(bomb_dir, tiny_scene, lambda meta: None)
    (bomb_dir / "train" / "r_0.png").write_bytes(png_declaring(20000, 20000, 1))
    assert_one_error_line(capsys, "train", str(bomb_dir), "--out", out, "--iters", "1")

    empty = tmp_path / "empty.ply"
    write_ply(empty, random_gaussians(1))
    data = empty.read_bytes()
    empty.write_bytes(data.replace(b"element vertex 1", b"element vertex 0")[:data.index(b"end_header\n") + 11])
    assert_one_error_line(capsys, "render", str(empty), "--cameras", str(tiny_scene / "transforms_train.json"),
                          "--out", out)
    model = tmp_path / "model.ply"
    write_ply(model, random_gaussians(10))
    for w, h in ((-4, 32), (32, 0), (100_000, 100_000)):
        cameras = tmp_path / f"cameras_{w}_{h}.json"
        meta = json.loads((tiny_scene / "transforms_train.json").read_text())
        cameras.write_text(json.dumps({**meta, "w": w, "h": h}))
        assert_one_error_line(capsys, "render", str(model), "--cameras", str(cameras), "--out", out)


def assert_one_error_line(capsys, *argv: str) -> None:
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith("error:") and "Traceback" not in err[0], (argv, err)


def test_session_names_that_alias_on_other_systems_are_refused(tmp_path, start_server):
    server = start_server(tmp_path / "work")
    with server.client() as client:
        client.call("open_session", name="Scene")
        with pytest.raises(RemoteError, match="only in case"):
            client.call("open_session", name="scene")
        for name in ("CON", "nul", "com1", "a."):
            with pytest.raises(ValueError, match="Windows"):  # the client checks what the server checks
                client.call("open_session", name=name)


# ---- model files that lie: decompression bombs, 4D models' files, COLMAP models ----

MIB = 1 << 20
RISE = 200 * MIB  # the most refusing a bomb may add to a process's peak memory


def ply_declaring(vertices: int, text: bool = False) -> bytes:
    """A 3DGS PLY of 3 splats whose header says `vertices` (in a text PLY: values of one vertex only)."""
    data = encode_ply(random_gaussians(3, sh_degree=0))
    if text:
        header = data[:data.index(b"end_header\n")].replace(b"binary_little_endian", b"ascii")
        data = header + b"end_header\n" + b" ".join([b"0.5"] * 17) + b"\n"
    return data.replace(b"element vertex 3\n", f"element vertex {vertices}\n".encode())


def bombs() -> dict[str, tuple[bytes, str]]:
    """Small files that declare or inflate to far more than they hold, and what each one's refusal says."""
    found = {
        "header_zeros.spz": (spz_of_zeros(1_000_000, spz_column_bytes(1_000_000)), "would inflate"),  # 65 MB in 64 KB
        "gzip_zeros.spz": (gzip_of_zeros(64 * MIB), "gzip data that is not SPZ"),
        "declares_10m.spz": (spz_of_zeros(10_000_000, 4 * MIB), "10,000,000 splats declared in"),
        "more_than_declared.spz": (spz_of_zeros(4, 256 * MIB), "bytes after the columns of 4 splats"),
        "vertices.ply": (ply_declaring(40_000_000), "unreadable PLY (its header declares"),
        "text_vertices.ply": (ply_declaring(40_000_000, text=True), "unreadable PLY (its header declares"),
        "too_many.ply": (ply_declaring(10**12), "over the limit of 50,000,000"),
        "chunks.compressed.ply": (formats.encode_any(random_gaussians(300, sh_degree=1), "compressed_ply").replace(
            b"element vertex 300\n", b"element vertex 40000000\n"), "unreadable PLY (its header declares"),
    }
    if importlib.util.find_spec("zstandard"):
        found["zstd_v4.spz"] = (zstd_spz_of_zeros(10_000_000), "10,000,000 splats declared in")
        found["zstd_more.spz"] = (zstd_spz_of_zeros(4, inflated=256 * MIB), "stream 0 unpacks to more than 36 bytes")
    return found


def test_decompression_bombs_are_refused_at_once_by_the_cli_with_little_memory(tmp_path):
    assert_bombs_refused(bombs(), tmp_path, RISE)  # what each declares or inflates to is 10-4000 times its size


def test_decompression_bombs_are_refused_by_the_server_and_leave_no_session(tmp_path, start_server):
    workdir = tmp_path / "work"
    server = start_server(workdir)
    files = bombs()
    with server.client() as client:
        client.call("status")
        ready = server.rss("VmHWM")
        for name, (data, said) in files.items():
            start = time.monotonic()
            with pytest.raises(RemoteError) as e:
                client.load_ply(data, name=name)
            assert e.value.code == "rejected" and said in e.value.message and "\n" not in e.value.message, name
            assert time.monotonic() - start < 10, name
        with pytest.raises(RemoteError, match="unreadable PLY") as e:  # a model sent to convert is read so too
            client.request("convert_model", {"name": "out.spz"}, files["vertices.ply"][0])
        assert e.value.code == "rejected"
        peak = server.rss("VmHWM")
    assert peak - ready < RISE, (ready, peak)
    assert [p for p in workdir.iterdir() if p.is_dir()] == []


def test_the_model_size_limit_is_a_server_flag_its_refusal_names(tmp_path, start_server):
    ply = encode_ply(random_gaussians(30, sh_degree=0))
    server = start_server(tmp_path / "work", "--max-model-splats", "20")
    with server.client() as client:
        with pytest.raises(RemoteError, match=r"30 splats, over the limit of 20 .*serve --max-model-splats N") as e:
            client.load_ply(ply, name="thirty.ply")
        assert e.value.code == "rejected"
        assert client.load_ply(encode_ply(random_gaussians(20, sh_degree=0)), name="twenty.ply")["gaussians"] == 20


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_every_format_reads_against_the_model_size_limit_and_through_the_validator(fmt):
    if fmt in formats.ENCODERS:
        data, n = formats.encode_any(random_gaussians(30, sh_degree=0), fmt), 30
        name = f"model{next(k for k, v in formats.SUFFIXES.items() if v == fmt)}"
    else:  # read only: a file the other tool wrote
        name = f"sh3.{fmt}"
        data, n = (ROOT / "tests" / "data" / "splats" / name).read_bytes(), 500
    with pytest.raises(SplatwrightError, match=rf"{n} splats, over the limit of {n - 10} for a model read from a "
                                               "file; ask"):
        formats.read_any(data, name, budget=Budget(n - 10, "ask"))
    assert len(formats.read_any(data, name, budget=Budget(n))) == n
    assert formats.DECODERS[fmt] is not None and "budget" in inspect.signature(formats.DECODERS[fmt]).parameters


def test_a_gzip_stream_of_several_members_reads_as_one():
    g = random_gaussians(50, sh_degree=1)
    one = formats.encode_any(g, "spz", spz_version=3)
    raw = gzip.decompress(one)
    halves = gzip.compress(raw[:100], mtime=0) + gzip.compress(raw[100:], mtime=0)
    assert_same_model(formats.read_any(halves, "two members"), formats.read_any(one, "one"))
    with pytest.raises(SplatwrightError, match="4 bytes after its end"):
        formats.read_any(halves + b"junk", "trailing")


def dynamic_file(**changes) -> bytes:
    """A 4D model's file (as write_dynamic writes it) of 200 Gaussians, its state or tensors changed: a key of
    `changes` naming a parameter replaces its tensor, any other replaces that entry of the file's state."""
    from backend.dynamic import _FILE_TAG, _FILE_VERSION
    tensors = {k: v.detach().clone() for k, v in moving_model(200).tensors().items()}
    state = {"format": _FILE_TAG, "version": _FILE_VERSION, "tensors": tensors}
    for key, value in changes.items():
        target = tensors if key in tensors or key == "extra" else state
        if value is ...:
            del target[key]
        else:
            target[key] = value
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def deflated(data: bytes) -> bytes:
    """A torch file's zip with its records compressed."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for record in source.infolist():
            z.writestr(record.filename, source.read(record))
    return out.getvalue()


def nan_row(n: int = 200) -> torch.Tensor:
    means = torch.zeros(n, 3)
    means[3, 1] = float("nan")
    return means


MALFORMED_4D = {
    "no tensors": (lambda: dynamic_file(tensors=...), "holds no parameters"),
    "tensors an int": (lambda: dynamic_file(tensors=5), "its parameters are int, not tensors by name"),
    "tensors None": (lambda: dynamic_file(tensors=None), "its parameters are NoneType"),
    "a string": (lambda: dynamic_file(means="means"), "means is str, not a tensor"),
    "0-d": (lambda: dynamic_file(means=torch.tensor(1.0)), "means is a single number"),
    "nested": (lambda: dynamic_file(velocities={"x": torch.zeros(3)}), "velocities is dict, not a tensor"),
    "a missing one": (lambda: dynamic_file(time_centers=...), "lack time_centers"),
    "an unknown one": (lambda: dynamic_file(extra=torch.zeros(200)), "include unknown extra"),
    "50 velocity rows": (lambda: dynamic_file(velocities=torch.zeros(50, 3)), "velocities has shape (50, 3); a "
                         "model of 200 Gaussians has (200, 3)"),
    "means (N, 2)": (lambda: dynamic_file(means=torch.zeros(200, 2)), "means has shape (200, 2)"),
    "sparse": (lambda: dynamic_file(means=torch.zeros(200, 3).to_sparse()), "sparse_coo tensor"),
    "float64": (lambda: dynamic_file(means=torch.zeros(200, 3, dtype=torch.float64)), "means holds float64"),
    "complex": (lambda: dynamic_file(means=torch.zeros(200, 3, dtype=torch.complex64)), "means holds complex64"),
    "NaN means": (lambda: dynamic_file(means=nan_row()), "1 of 200 Gaussians have NaN or infinite means "
                  "(first at row 3)"),
    "SH degree 4": (lambda: dynamic_file(sh_rest=torch.zeros(200, 24, 3)), "SH degree 4"),
    "repeated rows": (lambda: dynamic_file(means=torch.zeros(1, 3).expand(200, 3)), "repeats its data"),
    "negative windows": (lambda: dynamic_file(time_precisions=-torch.ones(200)), "negative time_precisions"),
    "version 2": (lambda: dynamic_file(version=2), "4D model version 2"),
    "compressed records": (lambda: deflated(dynamic_file()), "is compressed"),
    "objects other than tensors": (lambda: torch_bytes(torch.nn.Linear(2, 2)), "a torch file of objects other "
                                   "than tensors"),
    "not a torch file": (lambda: b"ply\nformat ascii 1.0\n", "not a torch file"),
}


def torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_malformed_4d_files_are_refused_in_one_line_by_the_cli_and_the_server(tmp_path, start_server, capsys):
    workdir = tmp_path / "work"
    server = start_server(workdir)
    files = {case: make() for case, (make, _) in MALFORMED_4D.items()}
    for case, data in files.items():
        path = tmp_path / "model.pt"
        path.write_bytes(data)
        code = cli.main(["convert", str(path), str(tmp_path / "out.ply")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1 and err[0].startswith("error: model.pt: "), (case, err)
        assert MALFORMED_4D[case][1] in err[0] and len(err[0]) < 300, (case, err)
        assert not (tmp_path / "out.ply").exists()
    with server.client() as client:
        for case, data in files.items():
            with pytest.raises(RemoteError) as e:
                client.load_ply(data, name="upload.pt")
            assert e.value.code == "rejected" and MALFORMED_4D[case][1] in e.value.message, (case, e.value.message)
            assert e.value.message.startswith("upload.pt: ") and "\n" not in e.value.message
        assert client.load_ply(dynamic_file(), name="good.pt")["gaussians"] == 200  # the same file, unchanged
    assert [p.name for p in workdir.iterdir() if p.is_dir()] == ["good"]


def test_the_cli_reads_a_foreign_pt_file_without_a_traceback(tmp_path):
    (tmp_path / "net.pt").write_bytes(torch_bytes(torch.nn.Linear(2, 2)))
    r = subprocess.run([sys.executable, "-m", "backend", "convert", str(tmp_path / "net.pt"), str(tmp_path / "o.ply")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "error: net.pt: not a Splatwright 4D model (a torch file of objects other than tensors; training on timed "
        "views writes splats4d.pt)"]


def colmap_capture(root: Path, binary: bool = True) -> Path:
    write_capture(root, orbit_cameras(6, 24, 20), binary=binary)
    return root / "sparse" / "0"


def patch(path: Path, offset: int, fmt: str, *values) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, *values)
    path.write_bytes(bytes(data))


def after(path: Path, marker: bytes) -> int:
    return path.read_bytes().index(marker) + len(marker)


COLMAP_BREAKAGES = {
    "2^64-1 cameras": (lambda m: patch(m / "cameras.bin", 0, "<Q", 2**64 - 1), "declares 18,446,744,073,709,551,615 "
                       "cameras"),
    "2^64-1 observations": (lambda m: patch(m / "images.bin", after(m / "images.bin", b"frame_003.png\0"), "<Q",
                                            2**64 - 1), "18,446,744,073,709,551,615 observations of image 103"),
    "a track of 2^62": (lambda m: patch(m / "points3D.bin", 8 + struct.calcsize("<Q3d3Bd"), "<Q", 2**62),
                        "track entries of point 1"),
    "2^64-1 points": (lambda m: patch(m / "points3D.bin", 0, "<Q", 2**64 - 1), "points, but its"),
    "a 200000x200000 camera": (lambda m: patch(m / "cameras.bin", 16, "<QQ", 200_000, 200_000),
                               "camera 1 is 200000x200000 pixels; sides are at most 8192"),
}


@pytest.mark.parametrize("breakage", list(COLMAP_BREAKAGES))
def test_colmap_counts_and_sizes_are_checked_before_anything_is_allocated(breakage, tmp_path):
    model = colmap_capture(tmp_path / "capture")
    edit, said = COLMAP_BREAKAGES[breakage]
    edit(model)
    write_ply(tmp_path / "model.ply", random_gaussians(10))
    runs = cli_memory(["train", str(tmp_path / "capture"), "--out", str(tmp_path / "out"), "--iters", "1"],
                      ["render", str(tmp_path / "model.ply"), "--cameras", str(tmp_path / "capture"), "--out",
                       str(tmp_path / "renders")])
    for run in runs:
        lines = run["stderr"].strip().splitlines()
        assert run["code"] == 1 and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], run
        assert run["rise"] < RISE, run
    assert not (tmp_path / "renders").exists() or not list((tmp_path / "renders").iterdir())


class Opened:
    """The files this process opens whose name contains `part` (an audit hook: Python's open, PIL's included)."""

    hooked: list["Opened"] = []

    def __init__(self, part: str):
        self.part, self.paths = part, []
        if not Opened.hooked:
            sys.addaudithook(Opened._hook)  # for the rest of the process: hooks cannot be removed
        Opened.hooked.append(self)

    @staticmethod
    def _hook(event: str, args: tuple) -> None:
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            for watch in Opened.hooked:
                if watch.part in os.fsdecode(args[0]):
                    watch.paths.append(os.fsdecode(args[0]))


@pytest.mark.parametrize("binary", [True, False])
def test_colmap_image_names_outside_the_images_folder_are_refused(tmp_path, capsys, binary):
    root = tmp_path / "capture"
    model = colmap_capture(root, binary)
    sentinel = root / "sentinel-outside.png"  # a real image beside images/, that training would read
    sentinel.write_bytes((root / "images" / "frame_001.png").read_bytes())
    opened = Opened("sentinel-outside")
    for name in ("../sentinel-outside.png", str(sentinel), "..\\sentinel-outside.png",
                 "sub/../../sentinel-outside.png"):
        for part in ("images.bin", "images.txt"):
            path = model / part
            if path.is_file():
                path.write_bytes(path.read_bytes().replace(b"frame_001.png", name.encode()))
        assert_one_error_line(capsys, "train", str(root), "--out", str(tmp_path / "out"), "--iters", "1")
        with pytest.raises(SplatwrightError, match=r"image 101: image name .* is not a path inside the images folder"):
            colmap.read_model(model)  # what the add-on's import reads first
        for part in ("images.bin", "images.txt"):
            path = model / part
            if path.is_file():
                path.write_bytes(path.read_bytes().replace(name.encode(), b"frame_001.png"))
    assert opened.paths == []
    assert colmap.image_path(root / "images", "cam0/frame_001.png") == root / "images" / "cam0" / "frame_001.png"
    for name in ("", "/etc/passwd", "\\\\server\\share\\x.png", "C:/x.png", "c:x.png", "a/./b.png", "a//b.png"):
        with pytest.raises(SplatwrightError, match="not a path inside the images folder"):
            colmap.image_path(root / "images", name)


# ---- a checkpoint that cannot be written: the model stays, and so does the checkpoint before ----

# Put on the server's PYTHONPATH as sitecustomize.py: while FLAG exists, torch.save writes part of a file and
# raises what torch's zip writer raises on a full disk.
FAILING_WRITER = """
import os
import torch

_save = torch.save


def save(obj, f, *args, **kwargs):
    if os.path.exists({flag!r}):
        f.write(b"PK" + bytes(100))
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    return _save(obj, f, *args, **kwargs)


torch.save = save
"""


def lose_no_model_to_a_failed_checkpoint(server, workdir: Path, scene, fail, recover, reason: str) -> None:
    """Train, checkpoint, train on; then with writes failing (`fail()`) save_checkpoint and stop's checkpoint are
    refused, naming the file and `reason`, while the model in memory stays and renders and the checkpoint on
    disk stays as it was; once `recover()` frees the disk the model exports, checkpoints and trains on."""
    checkpoint = workdir / "full" / "checkpoint.pt"
    with server.client() as client:
        client.call("open_session", name="full")
        add_scene_views(client, scene, 2)
        client.call("start_training", iterations=100_000, init_points=200, checkpoint_every=0,
                    checkpoint_seconds=0, progress_interval=0.05)
        wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= 3)
        client.call("pause")
        first = client.call("save_checkpoint")["step"]
        client.call("resume")
        wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= first + 3)
        fail()
        stopped = client.call("stop")  # its checkpoint fails: a warning, and the state is stopped
        wait_for(client, lambda e: e["event"] == "warning" and "checkpoint.pt" in e["message"]
                 and reason in e["message"])
        assert stopped["state"] == "stopped" and stopped["step"] > first
        with pytest.raises(RemoteError) as e:
            client.call("save_checkpoint")
        assert e.value.code == "rejected" and e.value.message.startswith("cannot write the checkpoint checkpoint.pt")
        assert reason in e.value.message and "\n" not in e.value.message
        assert load_checkpoint(checkpoint)["step"] == first and not list(checkpoint.parent.glob("*.tmp"))
        assert client.call("status")["step"] == stopped["step"]
        assert client.render(scene[1][0]).any()  # the model in memory draws
        recover()
        exported = client.request("export_ply")
        assert exported.fields["step"] == stopped["step"] and exported.fields["gaussians"] > 0
        assert client.call("save_checkpoint")["step"] == stopped["step"]
        assert load_checkpoint(checkpoint)["step"] == stopped["step"]
        client.call("resume")
        wait_for(client, lambda e: e["event"] == "progress" and e["step"] > stopped["step"])
        client.call("stop")


def test_a_checkpoint_writer_that_raises_is_answered_rejected_and_loses_nothing(tmp_path, start_server, scene):
    hook, flag = tmp_path / "hook", tmp_path / "disk-full"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAILING_WRITER.format(flag=str(flag)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    server = start_server(tmp_path / "work", env=env)
    lose_no_model_to_a_failed_checkpoint(server, tmp_path / "work", scene, flag.touch, flag.unlink,
                                         "unexpected pos 704 vs 598")


def test_a_full_disk_at_the_last_checkpoint_loses_nothing(tmp_path, start_server, scene):
    """A genuinely full file system: a 5 MB tmpfs (mounting one needs root)."""
    workdir = tmp_path / "full-disk"
    workdir.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(workdir)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a 5 MB tmpfs needs root")
    filler = workdir / "filler"

    def fill() -> None:
        with open(filler, "wb", buffering=0) as f:
            with pytest.raises(OSError):
                while True:
                    f.write(bytes(1 << 16))
    try:
        server = start_server(workdir)
        lose_no_model_to_a_failed_checkpoint(server, workdir, scene, fill, filler.unlink, "No space left on device")
        server.kill()
    finally:
        subprocess.run(["umount", "-l", str(workdir)], capture_output=True)


def test_the_cli_says_in_one_line_that_its_last_checkpoint_could_not_be_written(tiny_scene, tmp_path, capsys,
                                                                                  monkeypatch):
    def failing(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(torch, "save", failing)
    assert cli.main(["train", str(tiny_scene), "--out", str(tmp_path / "out"), "--iters", "3", "--device", "cpu",
                     "--init-points", "50"]) == 1
    err = capsys.readouterr().err.strip().splitlines()  # after the progress bar's line
    assert err[-1] == ("error: cannot write the checkpoint checkpoint.pt ([enforce fail at inline_container.cc:672] "
                       ". unexpected pos 704 vs 598)") and not any("Traceback" in line for line in err)
    assert not list((tmp_path / "out").glob("checkpoint*"))


# ---- renders nobody waits for ----

def show_a_small_model(client) -> None:
    client.load_ply(encode_ply(random_gaussians(300, seed=1, sh_degree=1)), name="small.ply")


def test_a_closed_connections_waiting_renders_are_dropped_and_the_next_clients_frame_comes_next(tmp_path,
                                                                                               start_server):
    """200 renders of 1024x1024 (about 4 s each on two CPU cores) queued on 200 streams by a client that then
    disconnects: at most the one already running completes, and a new client's 32x32 frame is answered next."""
    server = start_server(tmp_path / "work", "--max-queued-renders", "256")
    big, small = orbit_cameras(1, 1024, 1024)[0], orbit_cameras(1, SIZE, SIZE)[0]
    with server.client() as client:
        show_a_small_model(client)
        before = client.call("status")["rendered"]
        for stream in range(200):
            client.submit_render(big, stream=stream)
    start = time.monotonic()
    with server.client() as client:
        assert client.render(small).shape == (SIZE, SIZE, 4)
        answered = time.monotonic() - start
        rendered = client.call("status")["rendered"] - before
    dropped = int(re.search(r"closed with (\d+) render\(s\) waiting; they are dropped", server.log())[1])
    print(f"of 200 queued 1024x1024 renders {rendered - 1} completed and {dropped} were dropped; the next client's "
          f"32x32 frame came {answered:.1f} s after it connected")
    assert rendered - 1 <= 1 and dropped >= 199
    assert answered < 60  # one 1024x1024 render at most before it; the 200 would take over ten minutes


def test_a_connection_may_have_so_many_renders_waiting_and_a_stream_one(tmp_path, start_server):
    """Over the cap, a render on another stream is refused naming its flag; one on a stream that has a render
    waiting replaces that one. Six 4096x4096 renders (each over ten seconds on the CPU) on six streams with a cap
    of 3: the first is taken to render at some moment while the others arrive, so two or three of the last three
    are refused at once, and the second and third wait."""
    server = start_server(tmp_path / "work", "--max-queued-renders", "3")
    huge = orbit_cameras(1, 4096, 4096)[0]
    with server.client() as client:
        show_a_small_model(client)
        pending = [client.submit_render(huge, stream=stream) for stream in range(6)]
        deadline = time.monotonic() + 30
        while sum(p.done() for p in pending) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = [i for i, p in enumerate(pending) if p.done()]
        assert 2 <= len(refused) <= 3 and min(refused) >= 3, refused
        for i in refused:
            with pytest.raises(RemoteError) as refusal:
                pending[i].result(0)
            assert refusal.value.code == protocol.REJECTED
            assert "over the cap of 3 renders one connection may have waiting" in refusal.value.message
            assert "serve --max-queued-renders N" in refusal.value.message
        replacing = client.submit_render(huge, stream=2)
        with pytest.raises(RemoteError) as replaced:
            pending[2].result(30)
        assert replaced.value.code == protocol.SUPERSEDED and not replacing.done()


# ---- a backend whose Blender died ----

# Blender (the bpy module) starting the backend as the add-on does (runtime.LocalServer), trains through the add-on's
# client with no checkpoint but the last, prints the backend's pid, port and step, then waits to be killed.
PARENT = """
import json, sys, time
import bpy  # the parent is a Blender: the bpy module, in whose process the add-on runs
import torch
from blender_addon.core.client import Client
from blender_addon.logic.runtime import LocalServer
from backend.render import render
from helpers import ROOT, orbit_cameras, random_gaussians
from server_helpers import png_bytes, wait_for

server = LocalServer(sys.executable, str(ROOT), sys.argv[1])
client = Client("127.0.0.1", server.wait_ready(), server.token, timeout=60)
client.call("open_session", name="orphan")
model = random_gaussians(300, seed=1, sh_degree=1)
for camera in orbit_cameras(4, 32, 32):
    with torch.no_grad():
        image = render(model, camera, 1, (1.0, 1.0, 1.0)).image.clamp(0, 1)
    client.add_view(camera, png_bytes((image.numpy() * 255 + 0.5).astype("uint8")))
client.call("start_training", iterations=100_000, init_points=300, checkpoint_every=0, checkpoint_seconds=0,
            progress_interval=0.05)
step = wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= 5)["step"]
print(json.dumps({"pid": server.proc.pid, "port": server.port, "step": step}), flush=True)
time.sleep(600)
"""


def test_a_backend_started_as_the_add_on_starts_it_checkpoints_and_ends_when_its_parent_is_killed(tmp_path):
    """kill -9 of the Blender (the bpy module) that started the backend (with --exit-with-parent, its stdout a pipe to
    that process): the backend checkpoints the running training and exits within seconds, leaving its port free."""
    if subprocess.run([sys.executable, "-c", "import bpy"], capture_output=True).returncode:
        pytest.skip("needs the bpy module (Blender 4.5, which ./run installs) as the backend's parent")
    workdir = tmp_path / "work"
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(workdir)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": path})
    started = json.loads(parent.stdout.readline() or "null")
    assert started, "the parent exited before its backend trained"
    backend = started["pid"]
    try:
        parent.kill()
        killed = time.monotonic()
        parent.wait(10)
        while process_running(backend) and time.monotonic() - killed < 60:
            time.sleep(0.02)
        seconds = time.monotonic() - killed
        assert not process_running(backend), "the backend outlived its parent by a minute"
    finally:
        parent.stdout.close()
        if process_running(backend):
            os.kill(backend, signal.SIGKILL)
    print(f"the backend exited {seconds:.2f} s after its parent was killed; training had reached step "
          f"{started['step']}")
    assert load_checkpoint(workdir / "orphan" / "checkpoint.pt")["step"] >= started["step"]
    socket.create_server(("127.0.0.1", started["port"])).close()  # nothing holds its port
    assert seconds < 15  # about 1 s measured


# ---- exports killed half-way ----

def test_a_killed_ply_sequence_export_is_known_as_incomplete_and_a_finished_one_as_complete(tmp_path):
    """convert --frames killed by SIGKILL after its second frame: the manifest beside the frames says the sequence
    is incomplete, and reading one of its frames says so; converted again whole, it is complete, and a frame left
    from the longer export is known as none of its frames."""
    from backend.dynamic import write_dynamic
    write_dynamic(tmp_path / "splats4d.pt", moving_model(20_000))  # about 40 ms a frame
    out = tmp_path / "seq" / "moving.ply"
    frames = sequence_paths(out, 200)
    convert = subprocess.Popen([sys.executable, "-m", "backend", "convert", str(tmp_path / "splats4d.pt"), str(out),
                                "--frames", "200"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not frames[1].exists() and convert.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    convert.kill()
    assert convert.wait(10) == -signal.SIGKILL, "convert ended before it could be killed half-way"
    written = [frame for frame in frames if frame.exists()]
    assert 2 <= len(written) < 200
    state = sequence_state(frames[0])
    assert not state.complete and "export stopped before all 200 frames were in place" in state.message
    r = subprocess.run([sys.executable, "-m", "backend", "convert", str(frames[0]), str(tmp_path / "one.spz")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and f"warning: the sequence of {frames[0].name} is incomplete" in r.stderr, r.stderr

    r = subprocess.run([sys.executable, "-m", "backend", "convert", str(tmp_path / "splats4d.pt"), str(out),
                        "--frames", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sequence_state(frames[0]) == (True, "moving_0001.ply is frame 1 of a complete sequence of 1 "
                                               "(moving.sequence.json)")
    left = sequence_state(frames[1])
    assert not left.complete and "moving_0002.ply is none of the 1 frames" in left.message
    r = subprocess.run([sys.executable, "-m", "backend", "convert", str(frames[0]), str(tmp_path / "two.spz")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    print(f"{len(written)} of 200 frames were written when convert was killed")


# ---- imported sessions on disk ----

def test_imports_past_the_cap_of_imported_sessions_are_refused_naming_the_flag_and_the_oldest_unused(tmp_path,
                                                                                                    start_server):
    """With --max-imported-sessions 3, a fourth import is refused, makes no folder, and names the flag and the
    imported sessions neither open nor drawn lately, least recently used first; once one is removed, it goes."""
    workdir = tmp_path / "work"
    server = start_server(workdir, "--max-imported-sessions", "3")
    ply = encode_ply(random_gaussians(50, seed=2, sh_degree=0))

    def refusal() -> str:
        with pytest.raises(RemoteError) as refused:
            client.load_ply(ply, name="fourth.ply")
        assert refused.value.code == protocol.REJECTED and not (workdir / "fourth").exists()
        return refused.value.message

    with server.client() as client:
        for name in ("first", "second", "third", "second", "first"):  # imported, then second and first opened
            if (workdir / name).exists():
                client.call("open_session", name=name, create=False)
            else:
                client.load_ply(ply, name=f"{name}.ply")
            time.sleep(0.05)  # apart in the folders' times on any file system
        message = refusal()
        print(message)
        assert message == ("importing fourth.ply: imported sessions with its own: 4 is over the cap of 3 imported "
                           "models' sessions kept in the sessions folder; remove from the backend's sessions folder "
                           "the folders of the least recently used ones that are neither open nor drawn lately "
                           "(third, second; the oldest first), or start the backend with serve "
                           "--max-imported-sessions N to allow more")
        client.submit_render(orbit_cameras(1, SIZE, SIZE)[0], model="third").result(60)  # drawn lately
        assert "(second; the oldest first)" in refusal()
        shutil.rmtree(workdir / "second")
        assert client.load_ply(ply, name="fourth.ply")["session"] == "fourth"
    assert sorted(p.name for p in workdir.iterdir()) == ["first", "fourth", "third"]

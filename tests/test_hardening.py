"""The server against hostile or unlucky peers and machines, through the real socket (CPU): strangers that never
authenticate, sizes that are declared but not sent, images that lie about their size, work that would hold the
model for minutes, signals during long work, accept() failing, files a power loss left behind, a folder that
cannot be written; and the command line's one-line errors."""
from __future__ import annotations

import json
import resource
import signal
import socket
import statistics
import struct
import threading
import time
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
from backend.tools import cli
from backend.gaussians import _nearest_neighbour_distance
from backend.formats.ply import write_ply
from backend.service.server import FIRST_MESSAGE, read_token
from backend.service.session import Session
from backend.train import load_checkpoint, previous_checkpoint
from helpers import orbit_cameras, random_gaussians
from server_helpers import SIZE, add_scene_views, png_bytes, raw_connect, read_until_closed, wait_for


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

@pytest.mark.parametrize("kind", ["uniform", "surface", "clusters", "duplicates", "line"])
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
        else:
            points = torch.zeros(n, 3)
            points[:, 0] = torch.rand(n, generator=gen) ** 3
        d = torch.cdist(points, points, compute_mode="donot_use_mm_for_euclid_dist")
        d.fill_diagonal_(float("inf"))
        expected = d.topk(min(3, n - 1), largest=False).values.square().mean(dim=1).sqrt()
        assert torch.allclose(_nearest_neighbour_distance(points), expected, rtol=1e-4, atol=1e-6), (kind, n)


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

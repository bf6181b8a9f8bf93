"""The backend server, driven through the real socket and client on a tiny synthetic scene (CPU).

Most tests start `python -m backend serve` as a subprocess on loopback; the failure-injection test runs the
server in this process so it can make a training step fail on purpose.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from blender_addon.core import codecs, protocol
from blender_addon.core.cameras import Camera
from blender_addon.core.client import Client, PendingReply, RemoteError, decode_depth, decode_frame, wait_done
from blender_addon.core.protocol import REQUESTS
from backend.service.engine import Engine
from backend.formats.ply import read_ply, write_ply
from backend.render import render
from backend.service.server import Server
from backend.train import Trainer, load_checkpoint
from helpers import MIXED_SIZES, ROOT, cameras_of_sizes, random_gaussians
from server_helpers import (SIZE, add_scene_views, expected_frame, png_bytes, process_running, raw_connect,
                            read_until_closed, wait_for)


def test_session_end_to_end(tmp_path, start_server, scene):
    model, cameras, images = scene
    token = "s3cret-token"
    (tmp_path / "token").write_text(token + "\n")
    server = start_server(tmp_path / "work", "--token-file", str(tmp_path / "token"))

    with pytest.raises(RemoteError) as e:
        server.client("wrong")
    assert e.value.code == "auth" and "token" in e.value.message

    client = server.client(token)
    assert client.hello["protocol"] == protocol.PROTOCOL_VERSION and client.hello["session"] is None
    with pytest.raises(RemoteError) as e:  # one client at a time: a clear refusal, not a hang
        server.client(token)
    assert e.value.code == "busy"

    caps = client.call("capabilities")
    assert caps["device"] == "cpu" and caps["rasterizer"] == "reference" and caps["torch"] == torch.__version__

    with pytest.raises(RemoteError, match="no session is open"):
        client.add_view(cameras[0], png_bytes(images[0]))
    assert client.call("open_session", name="scene")["views"] == 0
    # The same views through every upload format: PNG, RGB8 and RGBA16F (raw rows bottom-up).
    client.add_view(cameras[0], png_bytes(images[0]))
    client.add_view(cameras[1], images[1][::-1])
    rgba16 = np.concatenate([images[2], np.full((SIZE, SIZE, 1), 255, np.uint8)], axis=-1) / 255.0
    assert client.add_view(cameras[2], rgba16[::-1].astype(np.float16))["views"] == 3

    with pytest.raises(RemoteError, match="camera is 32x32"):
        client.add_view(cameras[3], png_bytes(np.zeros((8, 8, 3), np.uint8)))
    sheared = cameras[3].c2w.copy()
    sheared[0][1] += 0.5
    with pytest.raises(ValueError, match="proper rotation"):  # the client checks it as the server does
        client.add_view(Camera(sheared, cameras[3].K, SIZE, SIZE), png_bytes(images[3]))
    with pytest.raises(RemoteError, match="nothing to render"):
        client.render(cameras[0])

    colors = (torch.sigmoid(model.sh_dc[:, 0]) * 255).to(torch.uint8).numpy()
    assert client.set_points(model.means.numpy(), colors)["points"] == 300
    started = client.call("start_training", iterations=20_000, checkpoint_every=25, progress_interval=0.1,
                                    max_gaussians=600, sh_degree=1)
    assert started["state"] == "training" and started["continued"] is False
    # The set-up (the initial Gaussians' neighbour search) runs on the training thread; a state event follows.
    assert wait_for(client, lambda e: e["event"] == "state" and e["gaussians"] > 0)["gaussians"] == 300
    with pytest.raises(RemoteError, match="already running"):
        client.call("start_training")

    progress = wait_for(client, lambda e: e["event"] == "progress" and e["loss"] is not None)
    assert progress["gaussians"] > 0 and progress["its_per_s"] > 0 and progress["psnr"] > 0
    # A view added while training joins the running trainer.
    client.add_view(cameras[3], png_bytes(images[3]))
    wait_for(client, lambda e: e["event"] == "progress" and e["views"] == 4)
    frame = client.render(cameras[0])
    assert frame.shape == (SIZE, SIZE, 4) and frame.dtype == np.uint8

    paused = client.call("pause")
    assert paused["state"] == "paused"
    time.sleep(0.3)
    with pytest.raises(RemoteError, match="stop it before loading"):
        client.load_ply(b"ply\n")
    # While paused the model is fixed: raw and PNG frames agree with each other and with a local render of
    # the exported PLY at the SH degree the server reports.
    reply = client.request("render", {"camera": cameras[4]})
    assert reply.fields["step"] == paused["step"]
    raw = client.render(cameras[4])
    assert np.array_equal(raw, client.render(cameras[4], format="png"))
    ply = client.request("export_ply").payload
    (tmp_path / "export.ply").write_bytes(ply)
    exported = read_ply(tmp_path / "export.ply")
    assert len(exported) == paused["gaussians"]
    expected = expected_frame(exported, cameras[4], reply.fields["sh_degree"], (1.0, 1.0, 1.0))
    assert np.abs(raw.astype(int) - expected).max() <= 1
    # With depth: the same frame, then the alpha-normalised view depth, rows bottom-up like the frame.
    for format in ("rgba8", "png"):
        reply = client.submit_render(cameras[4], format, depth=True).result(30)
        assert reply.fields["background"] == [1.0, 1.0, 1.0]
        assert np.array_equal(decode_frame(reply), raw)
        with torch.no_grad():
            out = render(exported, cameras[4], reply.fields["sh_degree"], (1.0, 1.0, 1.0))
        alpha = out.alpha.numpy()[::-1]
        depth = decode_depth(reply)
        assert depth.shape == (SIZE, SIZE) and (alpha > 0.5).any() and (alpha == 0).any()
        view_depth = (out.depth / out.alpha.clamp_min(1e-12)).numpy()[::-1]
        assert np.allclose(depth[alpha > 0], view_depth[alpha > 0], rtol=1e-4)
        assert np.all(depth[alpha == 0] == codecs.DEPTH_BACKGROUND)

    # A newer render request supersedes its stream's one that is still queued behind a slow render; another
    # stream's waits its turn.
    big = cameras[0].scaled(24)
    slow = client.submit_render(big, stream=1)
    time.sleep(0.05)
    queued = client.submit_render(cameras[1], stream=2)
    other = client.submit_render(cameras[3].scaled(0.5), stream=3)
    newest = client.submit_render(cameras[2], stream=2)
    assert slow.result(60).fields["width"] == big.width
    with pytest.raises(RemoteError) as e:
        queued.result(30)
    assert e.value.code == "superseded"
    assert newest.result(30).fields["width"] == SIZE
    assert other.result(30).fields["width"] == cameras[3].scaled(0.5).width

    saved = client.call("save_checkpoint")
    assert saved["step"] == paused["step"]
    assert client.call("resume")["state"] == "training"
    wait_for(client, lambda e: e["event"] == "progress" and e["step"] > paused["step"])
    stopped = client.call("stop")
    assert stopped["state"] == "stopped" and stopped["checkpoint"]
    checkpoint = load_checkpoint(tmp_path / "work" / "scene" / "checkpoint.pt")
    assert checkpoint["step"] == stopped["step"]
    assert client.call("load_checkpoint")["step"] == stopped["step"]

    # A PLY loaded to view, without training, over a black background.
    write_ply(tmp_path / "model.ply", model)
    loaded = client.load_ply((tmp_path / "model.ply").read_bytes(), background=(0.0, 0.0, 0.0))
    assert loaded == {"gaussians": 300, "sh_degree": 1, "session": "splats"}  # kept in a session of its own
    frame = client.render(cameras[5])
    assert np.abs(frame.astype(int) - expected_frame(model, cameras[5], 1, (0.0, 0.0, 0.0))).max() <= 1
    with pytest.raises(RemoteError, match="unreadable PLY|not a PLY"):
        client.load_ply(b"ply\nformat nonsense\n")

    assert client.call("shutdown")["state"] == "idle"  # of the PLY's session, open since its import
    assert server.proc.wait(30) == 0
    client.close()


def test_refuses_other_hosts_without_token(tmp_path):
    result = subprocess.run([sys.executable, "-m", "backend", "serve", "--host", "0.0.0.0", "--workdir",
                             str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert "refusing to serve without a token" in result.stderr and "--token-file" in result.stderr


def test_serves_on_the_add_ons_port_and_says_what_to_do_where_it_is_taken(tmp_path):
    try:
        taken = socket.create_server(("127.0.0.1", protocol.DEFAULT_PORT))
    except OSError:  # another program has it already
        taken = None
    try:
        result = subprocess.run([sys.executable, "-m", "backend", "serve", "--workdir", str(tmp_path)], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
    finally:
        if taken is not None:
            taken.close()
    assert result.returncode == 1 and result.stdout == ""
    assert f"cannot listen on 127.0.0.1:{protocol.DEFAULT_PORT}" in result.stderr
    assert "pass another --port (0: a free one)" in result.stderr


def test_handshake_errors(tmp_path, start_server):
    server = start_server(tmp_path / "work")
    with raw_connect(server.port, hello=False) as sock:
        protocol.send_message(sock, protocol.encode_message(REQUESTS, "hello", 1, {"token": "", "protocol": 99}))
        [error] = read_until_closed(sock)
    assert error.fields["code"] == "version" and "speaks protocol 99" in error.fields["message"]
    with raw_connect(server.port, hello=False) as sock:
        protocol.send_message(sock, protocol.encode_message(REQUESTS, "capabilities", 5))
        [error] = read_until_closed(sock)
    assert (error.id, error.fields["code"]) == (5, "auth")
    with raw_connect(server.port) as sock:  # a bad frame after hello: error reply, then the server hangs up
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        [error] = read_until_closed(sock)
    assert error.fields["code"] == "bad_frame"
    with raw_connect(server.port) as sock:  # a client vanishing mid-frame
        sock.sendall(b"".join(bytes(p) for p in protocol.encode_message(REQUESTS, "capabilities", 2))[:9])
    with server.client() as client:  # empty token accepted on loopback without --token-file
        assert client.call("capabilities")["protocol"] == protocol.PROTOCOL_VERSION


# ---- fuzzing ----

FUZZ_FRAMES = 10_000
FUZZ_SECONDS = 60
FUZZ_CAMERA = codecs.camera_to_wire(Camera(np.eye(4), np.array([[40.0, 0, 4], [0, 40.0, 4], [0, 0, 1]]), 8, 8))


def fuzz_templates() -> list[tuple[str, dict, bytes]]:
    """Valid requests to mutate; none that shuts down or starts training (a random start could keep the
    CPU busy for the rest of the test)."""
    return [
        ("capabilities", {}, b""), ("open_session", {"name": "fuzz"}, b""),
        ("add_view", {"camera": FUZZ_CAMERA, "format": "rgb8"}, bytes(8 * 8 * 3)),
        ("add_view", {"camera": FUZZ_CAMERA, "format": "png"}, png_bytes(np.zeros((8, 8, 3), np.uint8))),
        ("set_points", {"count": 2}, bytes(30)), ("pause", {}, b""), ("stop", {}, b""),
        ("render", {"camera": FUZZ_CAMERA}, b""), ("export_ply", {}, b""), ("save_checkpoint", {}, b""),
        ("load_checkpoint", {}, b""), ("load_ply", {}, b"ply\nformat binary_little_endian 1.0\n"),
        ("hello", {"token": "", "protocol": 1}, b""),
    ]


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63, -(2**70), rng.randrange(-10**6, 10**6)])
    if kind == 3:
        return rng.choice([0.5, -1e308, 1e-320, float(rng.uniform(-1e3, 1e3))])
    if kind == 4:
        return "".join(rng.choice("ab_./\\\u00e9\u4e2d\x00") for _ in range(rng.randrange(0, 80)))
    if kind == 5:
        return rng.choice(["rgba8", "png", "fuzz", "../x", "", "a" * 5000])
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if kind == 7:
        return [[rng.uniform(-2, 2) for _ in range(4)] for _ in range(rng.choice([3, 4]))]
    return {rng.choice(["camera", "name", "format", "count", "x", "c2w"]): random_json(rng, depth + 1)
            for _ in range(rng.randrange(0, 4))}


def fuzz_frame(rng: random.Random, templates) -> bytes:
    type, fields, payload = rng.choice(templates)
    fields = json.loads(json.dumps(fields))
    valid = b"".join(bytes(p) for p in protocol.encode_message(REQUESTS, type, rng.randrange(1, 1000),
                                                                 fields, payload))
    strategy = rng.randrange(8)
    if strategy == 0:  # random bytes, sometimes after the magic
        noise = rng.randbytes(rng.randrange(0, 64))
        return protocol.MAGIC + noise if rng.random() < 0.5 else noise
    if strategy == 1:  # flipped bytes anywhere
        data = bytearray(valid)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if strategy == 2:  # cut short
        return valid[:rng.randrange(len(valid))]
    if strategy == 3:  # a random header object
        header = {k: random_json(rng) for k in rng.sample(["type", "id", "payload_size", "fields", "x"],
                                                         rng.randrange(1, 5))}
        return protocol.PREFIX.pack(protocol.MAGIC, len(json.dumps(header))) + json.dumps(header).encode()
    if strategy == 4:  # random field values in a well-formed frame
        for key in list(fields) + ["x"] * (rng.random() < 0.2):
            if rng.random() < 0.6:
                fields[key] = random_json(rng)
        return protocol.encode_header(type, rng.randrange(1, 1000), fields, len(payload)) + payload
    if strategy == 5:  # a payload size that lies
        size = max(0, len(payload) + rng.choice([-5, -1, 1, 7, 1000]))
        return protocol.encode_header(type, 1, fields, size) + payload
    if strategy == 6:  # a random known type with random fields
        t = rng.choice([t for t in REQUESTS if t not in ("shutdown", "start_training", "resume")])
        return protocol.encode_header(t, rng.randrange(0, 2**53), random_json(rng, 2) or {}, 0)
    return valid


def test_fuzz_frames_then_server_still_works(tmp_path, start_server, scene):
    server = start_server(tmp_path / "work")
    rng = random.Random(1234)
    templates = fuzz_templates()
    sent = connections = replies = 0
    start = time.monotonic()
    while sent < FUZZ_FRAMES:
        assert time.monotonic() - start < FUZZ_SECONDS, f"only {sent} frames in {FUZZ_SECONDS} s"
        frames = [fuzz_frame(rng, templates) for _ in range(rng.randrange(1, 8))]
        with raw_connect(server.port, hello=rng.random() < 0.9) as sock:
            try:
                sock.sendall(b"".join(frames))
                sock.shutdown(socket.SHUT_WR)
                replies += len(read_until_closed(sock))  # every frame the server sends must parse
            except (ConnectionResetError, BrokenPipeError):
                pass  # the server hung up after a fatal frame while we were still sending
            except protocol.ProtocolError as e:
                assert "mid-frame" in e.message, e.message
        sent += len(frames)
        connections += 1
    elapsed = time.monotonic() - start
    print(f"fuzz: {sent} frames over {connections} connections, {replies} replies, {elapsed:.1f} s")
    assert server.proc.poll() is None

    model, cameras, _ = scene
    write_ply(tmp_path / "model.ply", model)
    with server.client() as client:
        assert client.hello["protocol"] == protocol.PROTOCOL_VERSION
        client.load_ply((tmp_path / "model.ply").read_bytes())
        frame = client.render(cameras[0])
    assert np.abs(frame.astype(int) - expected_frame(model, cameras[0], 1, (1.0, 1.0, 1.0))).max() <= 1


def test_a_session_trains_on_views_of_several_sizes_and_keeps_them(tmp_path, start_server):
    """Photos a few pixels apart (as undistorted ones are) in one session: stored, trained on while more join,
    counted against the session's pixel cap at their own sizes, and there again after a restart."""
    model = random_gaussians(300, seed=1, sh_degree=1)
    cameras = cameras_of_sizes(4, MIXED_SIZES)
    images = [expected_frame(model, cam, 1, (1.0, 1.0, 1.0))[::-1, :, :3].copy() for cam in cameras]
    pixels = sum(c.width * c.height for c in cameras)
    workdir = tmp_path / "work"
    server = start_server(workdir, "--max-session-pixels", str(pixels))
    with server.client() as client:
        client.call("open_session", name="sizes")
        for cam, image in zip(cameras[:3], images):
            client.add_view(cam, png_bytes(image))
        client.call("start_training", iterations=100_000, progress_interval=0.05, init_points=200, max_gaussians=400)
        wait_for(client, lambda e: e["event"] == "progress" and e["loss"] is not None)
        assert client.add_view(cameras[3], png_bytes(images[3]))["views"] == 4  # joins the running trainer
        progress = wait_for(client, lambda e: e["event"] == "progress" and e["views"] == 4 and e["step"] > 0)
        assert np.isfinite(progress["loss"])
        with pytest.raises(RemoteError, match=f"{pixels + 32 * 30:,} is over the cap of {pixels:,}"):
            client.add_view(cameras[0], png_bytes(images[0]))
        assert client.render(cameras[2]).shape == (32, 31, 4)
        client.call("shutdown")
    assert server.proc.wait(30) == 0
    server = start_server(workdir)
    with server.client() as client:
        assert client.call("open_session", name="sizes", create=False)["views"] == 4
        client.call("start_training", fresh=True, iterations=3, progress_interval=0.05, init_points=200)
        assert wait_for(client, lambda e: e["event"] == "state" and e["state"] == "finished")["step"] == 3


# ---- durability ----

def test_kill_during_training_then_resume(tmp_path, start_server, scene):
    workdir = tmp_path / "work"
    server = start_server(workdir)
    every = 20
    with server.client() as client:
        client.call("open_session", name="durable")
        add_scene_views(client, scene)
        client.call("start_training", iterations=100_000, checkpoint_every=every, progress_interval=0.05,
                              init_points=200, max_gaussians=400)
        last_seen = wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= 3 * every)["step"]
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)

    checkpoint = load_checkpoint(workdir / "durable" / "checkpoint.pt")  # intact despite the kill
    saved = checkpoint["step"]
    assert saved % every == 0 and saved >= last_seen - every

    server = start_server(workdir)
    with server.client() as client:
        reopened = client.call("open_session", name="durable", create=False)
        assert reopened["views"] == 4 and reopened["checkpoint"] and reopened["state"] == "idle"
        started = client.call("start_training", checkpoint_every=every, progress_interval=0.05)
        assert started["continued"]
        assert wait_for(client, lambda e: e["event"] == "state" and e["step"] > 0)["step"] >= saved
        event = wait_for(client, lambda e: e["event"] == "progress")
        assert event["step"] > saved  # continued from the checkpoint, not restarted from 0
        assert event["iterations"] == 100_000  # the checkpoint's configuration
        client.call("shutdown")
    assert server.proc.wait(30) == 0
    assert load_checkpoint(workdir / "durable" / "checkpoint.pt")["step"] > saved


def test_resume_after_a_restart_keeps_the_sessions_cadence(tmp_path, start_server, scene):
    """The whole training settings are saved with the session: a resume after a crash checkpoints and reports
    as the run did before, not at the defaults."""
    workdir = tmp_path / "work"
    every, interval = 7, 0.07
    assert every != REQUESTS["start_training"].fields.fields["checkpoint_every"].default
    server = start_server(workdir)
    with server.client() as client:
        client.call("open_session", name="cadence")
        add_scene_views(client, scene)
        started = client.call("start_training", iterations=100_000, checkpoint_every=every, progress_interval=interval,
                                        init_points=200, max_gaussians=400)
        assert started["settings"]["checkpoint_every"] == every
        wait_for(client, lambda e: e["event"] == "progress" and e["step"] >= 2 * every)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
    saved = load_checkpoint(workdir / "cadence" / "checkpoint.pt")["step"]

    server = start_server(workdir)
    with server.client() as client:
        reopened = client.call("open_session", name="cadence", create=False)
        assert reopened["settings"]["checkpoint_every"] == every
        assert reopened["settings"]["progress_interval"] == interval
        client.call("resume")
        checkpoints = set()
        deadline = time.monotonic() + 60
        while len(checkpoints) < 2 and time.monotonic() < deadline:
            step = load_checkpoint(workdir / "cadence" / "checkpoint.pt")["step"]
            if step > saved:
                checkpoints.add(step)
            time.sleep(0.05)
        assert len(checkpoints) == 2 and all(step % every == 0 for step in checkpoints), checkpoints
        client.call("shutdown")
    assert server.proc.wait(30) == 0


# ---- failures inside training and rendering (server in this process to inject them) ----

@pytest.fixture
def local_server(tmp_path):
    server = Server(Engine(tmp_path, "cpu", "reference"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stop()
    thread.join(30)


def test_nan_loss_and_out_of_memory_are_reported_and_survived(local_server, scene, monkeypatch):
    original_step = Trainer.train_step
    failure: list[BaseException] = []

    def failing_step(self):
        if failure and self.step >= 30:
            raise failure[0]
        original_step(self)
    monkeypatch.setattr(Trainer, "train_step", failing_step)

    with Client("127.0.0.1", local_server.port) as client:
        client.call("open_session", name="failing")
        add_scene_views(client, scene)
        failure.append(FloatingPointError("loss became nan at step 31"))
        client.call("start_training", iterations=1000, checkpoint_every=10, progress_interval=0.05, init_points=200)
        error = wait_for(client, lambda e: e["event"] == "error")
        assert error["code"] == "diverged" and "loss became nan" in error["message"]
        assert "last checkpoint, step 30" in error["message"]
        failed = wait_for(client, lambda e: e["event"] == "state")
        assert failed["state"] == "failed" and failed["reason"] == error["message"]
        assert client.call("status")["step"] == 30  # back at the checkpoint, still serving

        failure[0] = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        client.call("resume")
        error = wait_for(client, lambda e: e["event"] == "error")
        assert error["code"] == "out_of_memory" and "max_gaussians" in error["message"]

        failure.clear()
        client.call("resume")
        assert wait_for(client, lambda e: e["event"] == "progress" and e["step"] > 35)["state"] == "training"

        def render_out_of_memory(*args, **kwargs):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        with monkeypatch.context() as m:
            m.setattr("backend.service.frames.render", render_out_of_memory)
            with pytest.raises(RemoteError) as e:
                client.render(scene[1][0])
        assert e.value.code == "out_of_memory"
        assert client.render(scene[1][0]).shape == (SIZE, SIZE, 4)
        client.call("stop")


def test_server_stops_when_the_process_that_started_it_dies(tmp_path):
    # A shell starts the server and waits; killing the shell orphans the server, which must then stop.
    command = (f"'{sys.executable}' -m backend serve --port 0 --workdir '{tmp_path}' --exit-with-parent & "
               "echo pid $!; wait")
    shell = subprocess.Popen(["bash", "-c", command], cwd=Path(__file__).resolve().parent.parent,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    server_pid = int(shell.stdout.readline().split()[1])
    assert json.loads(shell.stdout.readline())["event"] == "ready"
    shell.kill()
    shell.wait()
    deadline = time.monotonic() + 20
    while process_running(server_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if process_running(server_pid):
        os.kill(server_pid, signal.SIGKILL)
        pytest.fail("the orphaned server kept running")


def test_waiting_for_a_reply_gives_up_when_cancelled_and_passes_on_its_errors():
    """An F12 render waits on its reply this way: cancelling (Esc) must not wait for the reply."""
    pending = PendingReply("render")
    start = time.monotonic()
    with pytest.raises(InterruptedError):
        wait_done(pending, "render", 60, cancelled=lambda: True)
    assert time.monotonic() - start < 1
    with pytest.raises(TimeoutError, match="within 0 s"):
        wait_done(pending, "render", 0.2, cancelled=lambda: False)
    failed = PendingReply("render")
    failed._finish(error=TimeoutError("the backend's own timeout"))
    with pytest.raises(TimeoutError, match="own timeout"):
        wait_done(failed, "render", 60, cancelled=lambda: False)
    answered = PendingReply("render")
    answered._finish(reply="frame")
    assert wait_done(answered, "render", 60, cancelled=lambda: False) == "frame"

    class AnsweredAsTheWaitRanOut(PendingReply):
        """The reply arrives between a poll's wait running out and the check that follows it."""
        def result(self, timeout=None):
            if not self.done():
                self._finish(reply="late frame")
                raise TimeoutError("no reply to render within 0.1 s")
            return super().result(timeout)
    assert wait_done(AnsweredAsTheWaitRanOut("render"), "render", 60, cancelled=lambda: False) == "late frame"

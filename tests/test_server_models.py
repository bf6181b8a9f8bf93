"""The backend's render and export_ply of a model named by its session (its saved model, beside the open session's),
cropped by a box and placed in another space; the server runs in this process on loopback (CPU)."""
from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from blender_addon.core import codecs, protocol
from blender_addon.core.cameras import Camera
from blender_addon.core.client import Client, RemoteError, decode_frame
from blender_addon.core.protocol import REQUESTS, SERVER_MESSAGES
from backend.service.engine import Engine
from backend.service.saved_models import read_model_file
from backend.formats import encode_any
from backend.gaussians import Gaussians
from backend.formats.ply import encode_ply, read_ply
from backend.render.reference import quat_to_rotmat
from backend.service.server import Server
from backend.service.session import Session, imported_file
from backend.train import TrainConfig, Trainer
from helpers import assert_same_model, moving_model, orbit_cameras, random_gaussians
from server_helpers import expected_frame, raw_connect, serving, wait_for

SIZE = 24
BACKGROUNDS = {"near": (1.0, 1.0, 1.0), "far": (0.2, 0.3, 0.4)}


def save_model(workdir: Path, name: str, model: Gaussians, step: int = 1, dynamic: bool = False) -> None:
    """A session `name` in `workdir` whose checkpoint holds `model` at `step`, with two small views."""
    folder_exists = (workdir / name).is_dir()
    session = Session.open(workdir, name, create=True)
    background = BACKGROUNDS.get(name, (1.0, 1.0, 1.0))
    if not folder_exists:
        for i, cam in enumerate(orbit_cameras(2, 16, 16)):
            with torch.no_grad():
                image = expected_frame(model, cam, model.max_sh_degree, background)[::-1, :, :3]
            session.add_view(cam, np.ascontiguousarray(image), f"view_{i}")
    cfg = TrainConfig(iterations=step, sh_degree=model.max_sh_degree, sh_interval=1, background=background,
                      dynamic=dynamic)
    trainer = Trainer(session.dataset(background), cfg, "cpu", model.detached())
    trainer.step = step
    trainer.save_checkpoint(session.checkpoint_path)


@pytest.fixture
def server(tmp_path):
    models = {"near": random_gaussians(200, seed=2, sh_degree=1), "far": random_gaussians(150, seed=3, sh_degree=1)}
    for name, model in models.items():
        save_model(tmp_path, name, model)
    server = Server(Engine(tmp_path, "cpu", "reference"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, models
    server.stop()
    thread.join(30)


def box(centre, half_sizes, turn: float = 0.0) -> np.ndarray:
    """Model space into the unit cube of a box at `centre` with `half_sizes`, turned `turn` about z."""
    c, s = math.cos(turn), math.sin(turn)
    to_model = np.eye(4)
    to_model[:3, :3] = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]) @ np.diag(half_sizes)
    to_model[:3, 3] = centre
    return np.linalg.inv(to_model)


def inside(means: np.ndarray, crop: np.ndarray) -> np.ndarray:
    return np.all(np.abs(means @ crop[:3, :3].T + crop[:3, 3]) <= 1.0, axis=-1)


def test_a_render_of_a_named_session_draws_its_saved_model_and_leaves_the_open_one(server):
    server, models = server
    cam = orbit_cameras(1, SIZE, SIZE)[0]
    with Client("127.0.0.1", server.port) as client:
        client.call("open_session", name="near")
        client.call("load_checkpoint")
        far = client.request("render", {"camera": cam, "model": "far"})
        assert far.fields["background"] == list(BACKGROUNDS["far"]) and far.fields["step"] == 1
        assert np.array_equal(decode_frame(far), expected_frame(models["far"], cam, 1, BACKGROUNDS["far"]))
        status = client.call("status")
        assert status["session"] == "near" and status["gaussians"] == len(models["near"])
        near = expected_frame(models["near"], cam, 1, BACKGROUNDS["near"])
        assert np.array_equal(decode_frame(client.request("render", {"camera": cam})), near)
        assert np.array_equal(decode_frame(client.request("render", {"camera": cam, "model": "near"})), near)

        # Training the open session goes on while another session's model is drawn.
        client.call("start_training", iterations=10_000, fresh=True, init_points=100, progress_interval=0.05)
        wait_for(client, lambda e: e["event"] == "progress" and e["step"] > 2)
        again = client.request("render", {"camera": cam, "model": "far"})
        assert np.array_equal(decode_frame(again), decode_frame(far))
        assert wait_for(client, lambda e: e["event"] == "progress" and e["step"] > 5)["state"] == "training"
        client.call("stop")

        # A checkpoint written since is loaded again; a session without one, or none at all, is refused.
        replaced = random_gaussians(50, seed=9, sh_degree=1)
        save_model(Path(server.engine.workdir), "far", replaced, step=7)
        reply = client.request("render", {"camera": cam, "model": "far"})
        assert reply.fields["step"] == 7
        assert np.array_equal(decode_frame(reply), expected_frame(replaced, cam, 1, BACKGROUNDS["far"]))
        Session.open(Path(server.engine.workdir), "fresh", create=True)
        for name, said in (("fresh", "session 'fresh' has no saved model yet"),
                           ("absent", "session 'absent' does not exist")):
            with pytest.raises(RemoteError, match=said) as e:
                client.request("render", {"camera": cam, "model": name})
            assert e.value.code == protocol.REJECTED


def test_a_crop_box_keeps_the_gaussians_inside_it_in_renders_and_exports(server, tmp_path):
    server, models = server
    cam = orbit_cameras(1, SIZE, SIZE)[0]
    crop = box([0.2, -0.1, 0.0], [0.5, 0.4, 0.6], turn=0.4)
    far = models["far"]
    kept = inside(far.means.numpy().astype(np.float64), crop)
    assert 10 < kept.sum() < len(far) - 10
    subset = Gaussians(**{k: v[torch.from_numpy(kept)] for k, v in far.tensors().items()})
    with Client("127.0.0.1", server.port) as client:
        client.call("open_session", name="near")
        reply = client.request("render", {"camera": cam, "model": "far", "crop": crop})
        assert np.array_equal(decode_frame(reply), expected_frame(subset, cam, 1, BACKGROUNDS["far"]))
        exported = client.request("export_ply", {"model": "far", "crop": crop, "name": "cropped.ply"})
        (tmp_path / "cropped.ply").write_bytes(exported.payload)
        model = read_ply(tmp_path / "cropped.ply")
        print(f"the crop box keeps {kept.sum()} of {len(far)} Gaussians")
        assert exported.fields["gaussians"] == len(model) == kept.sum() and exported.fields["path"] == ""
        np.testing.assert_allclose(model.means.numpy(), subset.means.numpy(), atol=1e-6)


def test_an_export_in_another_space_moves_the_means_rotations_scales_and_colours(server, tmp_path):
    """The means, rotations and scales move with the placement, and the placed model seen through the camera
    placed with it looks as the model did, view-dependent colours included."""
    server, models = server
    scale, angle = 1.7, 0.8
    axis = np.array([1.0, 2.0, 2.0]) / 3.0
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    rotation = np.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * k @ k
    placement = np.eye(4)
    placement[:3, :3], placement[:3, 3] = scale * rotation, [0.5, -2.0, 1.0]
    near = models["near"]
    with Client("127.0.0.1", server.port) as client:
        client.call("open_session", name="far")
        exported = client.request("export_ply", {"model": "near", "placement": placement})
    (tmp_path / "placed.ply").write_bytes(exported.payload)
    placed = read_ply(tmp_path / "placed.ply")
    assert len(placed) == len(near) and near.max_sh_degree == 1
    means = near.means.double().numpy()
    np.testing.assert_allclose(placed.means.numpy(), means @ placement[:3, :3].T + placement[:3, 3], atol=1e-5)
    np.testing.assert_allclose(placed.log_scales.numpy(), near.log_scales.numpy() + math.log(scale), atol=1e-5)
    turned = rotation @ quat_to_rotmat(near.quats.double()).numpy()
    np.testing.assert_allclose(quat_to_rotmat(placed.quats.double()).numpy(), turned, atol=1e-5)
    for cam in orbit_cameras(3, 48, 40):
        moved = np.eye(4)
        moved[:3, :3], moved[:3, 3] = rotation @ cam.c2w[:3, :3], placement[:3, :3] @ cam.c2w[:3, 3] + placement[:3, 3]
        before = expected_frame(near, cam, 1, (0.0, 0.0, 0.0)).astype(int)
        after = expected_frame(placed, Camera(moved, cam.K, cam.width, cam.height), 1, (0.0, 0.0, 0.0)).astype(int)
        assert np.abs(after - before).max() <= 1


@pytest.mark.parametrize("request_type, fields, said", [
    ("render", {"crop": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]}, "render: crop: expected a list of shape [4, 4]"),
    ("render", {"crop": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]},
     "render: crop: the last row is 0 0 1 1, not 0 0 0 1 (an affine matrix)"),
    ("render", {"crop": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, "1"]]},
     "render: crop: expected a number, got str"),
    ("render", {"model": "../etc"}, "render: model: '../etc': use up to 64 letters"),
    ("export_ply", {"placement": [[1, 0, 0, 0], [0, 2, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]},
     "export_ply: placement: the matrix is scaled unevenly (1, 2, 1) or sheared"),
    ("export_ply", {"placement": [[-1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]},
     "export_ply: placement: the matrix has a zero or mirroring scale"),
])
def test_a_bad_model_choice_is_refused_in_one_line_and_the_connection_goes_on(server, request_type, fields, said):
    server, _ = server
    if request_type == "render":
        fields = {"camera": codecs.camera_to_wire(orbit_cameras(1, 8, 8)[0]), **fields}
    with raw_connect(server.port) as sock:
        sock.sendall(protocol.encode_header(request_type, 3, fields, 0))
        error = protocol.read_message(sock, SERVER_MESSAGES)
        assert (error.type, error.id, error.fields["code"]) == ("error", 3, protocol.BAD_REQUEST)
        assert error.fields["message"].startswith(said) and "\n" not in error.fields["message"]
        protocol.send_message(sock, protocol.encode_message(REQUESTS, "status", 4))
        assert protocol.read_message(sock, SERVER_MESSAGES).fields["session"] is None


def test_a_4d_session_renders_and_exports_the_time_asked_for(tmp_path):
    """A session whose checkpoint is a 4D model: render and export at a time give the model at that time
    (null: its first frame), two times give different frames, and a static model ignores the time."""
    from backend.dynamic import DynamicGaussians
    model = DynamicGaussians.from_static(random_gaussians(80, seed=6, sh_degree=0, scale=0.12))
    model.velocities = torch.full((len(model), 3), 0.6)
    save_model(tmp_path, "moving", model, dynamic=True)
    save_model(tmp_path, "still", random_gaussians(80, seed=7, sh_degree=0))
    server = Server(Engine(tmp_path, "cpu", "reference"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cam = orbit_cameras(4, 40, 32)[1]
    try:
        with Client("127.0.0.1", server.port) as client:
            frames = {}
            for time in (None, 0.0, 0.8):
                reply = client.request("render", {"camera": cam, "model": "moving", "time": time})
                frames[time] = decode_frame(reply)
                expected = expected_frame(model.at(0.0 if time is None else time), cam, 0, (1.0, 1.0, 1.0))
                assert np.array_equal(frames[time], expected), time
            assert np.array_equal(frames[None], frames[0.0]) and not np.array_equal(frames[0.0], frames[0.8])
            exported = client.request("export_ply", {"model": "moving", "time": 0.8, "name": "at.ply"})
            (tmp_path / "at.ply").write_bytes(exported.payload)
            np.testing.assert_allclose(read_ply(tmp_path / "at.ply").means.numpy(), model.at(0.8).means.numpy(),
                                       atol=1e-6)
            still = [decode_frame(client.request("render", {"camera": cam, "model": "still", "time": t}))
                     for t in (0.0, 0.8)]
            assert np.array_equal(*still)
            with pytest.raises(ValueError, match="time: 1.5 is outside"):  # checked before it is sent
                client.request("render", {"camera": cam, "model": "moving", "time": 1.5})
    finally:
        server.stop()
        thread.join(30)


@pytest.fixture
def viewer(tmp_path):
    """A server with nothing open, to load files into."""
    server = Server(Engine(tmp_path / "sessions", "cpu", "reference"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stop()
    thread.join(30)


def test_an_imported_file_is_kept_in_a_session_named_after_it(tmp_path):
    """Each import makes a session of its own, which opens and shows the file; renders naming it draw it, also
    after a restart, and opening it and loading its model (Show Model) shows it again. A file that cannot be read
    makes none."""
    model = random_gaussians(120, seed=4, sh_degree=2)
    data = encode_ply(model)
    workdir, background = tmp_path / "sessions", (0.1, 0.2, 0.3)
    cam = orbit_cameras(1, SIZE, SIZE)[0]
    expected = expected_frame(model, cam, 2, background)
    with serving(workdir) as client:
        with pytest.raises(RemoteError, match="bad.ply"):
            client.load_ply(b"ply\nformat nonsense\n", background, "bad.ply")
        assert not workdir.exists() or not any(workdir.iterdir())
        first, second = (client.load_ply(data, background, "my model.ply") for _ in range(2))
        assert (first["session"], second["session"], second["gaussians"]) == ("my-model", "my-model-2", len(model))
        status = client.call("status")
        assert (status["session"], status["checkpoint"], status["views"]) == ("my-model-2", True, 0)
        for choice in ({}, {"model": "my-model"}, {"model": "my-model-2"}):
            reply = client.request("render", {"camera": cam, **choice})
            assert np.array_equal(decode_frame(reply), expected) and reply.fields["background"] == list(background)
        with pytest.raises(RemoteError, match="no views yet"):
            client.call("start_training")
    with serving(workdir) as client:  # a restarted backend
        assert np.array_equal(decode_frame(client.request("render", {"camera": cam, "model": "my-model"})), expected)
        assert client.call("open_session", name="my-model", create=False)["checkpoint"]
        assert client.call("load_checkpoint")["gaussians"] == len(model)
        assert np.array_equal(decode_frame(client.request("render", {"camera": cam})), expected)
        exported = client.request("export_ply", {"name": "again.ply"})
        assert_same_model(read_ply(bytes(exported.payload)), model)


def test_renders_of_a_kept_imported_model_read_its_session_file_once(tmp_path, monkeypatch):
    """A viewer draws an imported session's model frame after frame: its session.json is read when the model is
    first loaded, not for every frame."""
    import backend.service.saved_models
    reads = []

    def counted(folder):
        reads.append(folder.name)
        return imported_file(folder)

    monkeypatch.setattr(backend.service.saved_models, "imported_file", counted)
    model = random_gaussians(60, seed=5, sh_degree=0)
    cam = orbit_cameras(1, SIZE, SIZE)[0]
    with serving(tmp_path / "sessions") as client:
        client.load_ply(encode_ply(model), (1.0, 1.0, 1.0), "kept.ply")
        client.load_ply(encode_ply(model), (1.0, 1.0, 1.0), "open.ply")  # the open session is another
        frames = [decode_frame(client.request("render", {"camera": cam, "model": "kept"})) for _ in range(3)]
    assert reads.count("kept") == 1 and all(np.array_equal(f, frames[0]) for f in frames)


@pytest.mark.parametrize("name, fmt", [("donut.splat", "splat"), (".splat", "splat"), ("a.compressed.ply",
                                       "compressed_ply"), ("scan.SPZ", "spz"), ("no ending", "ply")])
def test_an_imported_session_reads_its_file_back_as_the_import_did(tmp_path, name, fmt):
    """The kept file's ending tells its format as the import's name did (a .splat has no magic bytes)."""
    model = random_gaussians(40, seed=5, sh_degree=0 if fmt == "splat" else 1)
    data = encode_any(model, fmt)
    session = Session.create_imported(tmp_path, name, data, (0.5, 0.5, 0.5))
    path, background, spz_axes = imported_file(session.folder)
    assert background == (0.5, 0.5, 0.5) and path.read_bytes() == data and spz_axes == "ply"
    assert_same_model(read_model_file(path.read_bytes(), path.name), read_model_file(data, name))


def test_an_imported_spz_is_read_in_the_axes_the_import_asked_also_after_a_restart(tmp_path):
    """An SPZ that does not say its axes (our version 3: RUB) reads as the model in the axes rub, turned half about
    x in the default ply; the session keeps the choice."""
    model = random_gaussians(80, seed=6, sh_degree=1)
    data = encode_any(model, "spz", spz_version=3)
    workdir = tmp_path / "sessions"
    exported = lambda client: read_ply(bytes(client.request("export_ply", {"name": "m.ply"}).payload))  # noqa: E731
    with serving(workdir) as client:
        client.load_ply(data, None, "turned.spz")
        turned = exported(client)
        assert client.load_ply(data, None, "asked.spz", "rub")["session"] == "asked"
        assert (exported(client).means - model.means).abs().max() < 1e-3
    assert torch.allclose(turned.means, exported_means := model.means * torch.tensor([1.0, -1, -1]), atol=1e-3)
    with serving(workdir) as client:  # a restarted backend reads the kept file as the import did
        client.call("open_session", name="asked", create=False)
        client.call("load_checkpoint")
        assert (exported(client).means - model.means).abs().max() < 1e-3
        client.call("open_session", name="turned", create=False)
        client.call("load_checkpoint")
        assert torch.allclose(exported(client).means, exported_means, atol=1e-3)


def test_a_session_imported_before_the_axes_were_recorded_reads_its_spz_as_it_did_then(tmp_path):
    """Its session.json names no axes: an SPZ without a coordinate-system record was read as RUB then, and still
    is, so the model does not turn when the backend is updated."""
    session = Session.create_imported(tmp_path, "old.spz", encode_any(random_gaussians(8), "spz", spz_version=3),
                                      (1.0, 1.0, 1.0))
    meta = json.loads((session.folder / "session.json").read_text())
    del meta["imported"]["spz_axes"]
    (session.folder / "session.json").write_text(json.dumps(meta))
    assert imported_file(session.folder)[2] == "rub"


def test_a_loaded_4d_model_file_is_drawn_and_exported_at_each_requests_time(viewer, tmp_path):
    """splats4d.pt's bytes, named so or not, are viewed as the 4D model: renders and exports at two times are the
    model at those times, and a .pt export is the model's own file again (placed, its motion too)."""
    from backend.dynamic import read_dynamic, write_dynamic
    model = moving_model()
    write_dynamic(tmp_path / "splats4d.pt", model)
    data = (tmp_path / "splats4d.pt").read_bytes()
    cam = orbit_cameras(4, 40, 32)[1]
    with Client("127.0.0.1", viewer.port) as client:
        for name in ("splats4d.pt", "upload.bin", ""):  # by its name, or by its content
            reply = client.load_ply(data, name=name)
            assert (reply["gaussians"], reply["sh_degree"]) == (len(model), 1), name
            status = client.call("status")
            assert status["dynamic"] and status["gaussians"] == len(model), name
        frames = {}
        for time in (0.2, 0.9):
            frames[time] = decode_frame(client.request("render", {"camera": cam, "time": time}))
            assert np.array_equal(frames[time], expected_frame(model.at(time), cam, 1, (1.0, 1.0, 1.0))), time
            exported = client.request("export_ply", {"time": time, "name": "at.ply"})
            assert exported.fields["dynamic"] and exported.fields["format"] == "ply"
            (tmp_path / "at.ply").write_bytes(exported.payload)
            assert_same_model(read_ply(tmp_path / "at.ply"), model.at(time).detached(), atol=1e-6)
        assert not np.array_equal(frames[0.2], frames[0.9])

        from blender_addon.core.splats import read_motion_ply_bytes
        moving = client.request("export_ply", {"motion": True, "time": 0.3, "name": "any.spz"})
        static, motion = read_motion_ply_bytes(moving.payload)  # the parameters at the time centres, and the motion
        assert moving.fields["dynamic"] and moving.fields["format"] == "ply" and moving.fields["path"] == ""
        np.testing.assert_array_equal(static.means, model.means.numpy())
        np.testing.assert_array_equal(motion["angular_velocities"], model.angular_velocities.numpy())
        np.testing.assert_array_equal(motion["time_precisions"], model.time_precisions.numpy())

        own = client.request("export_ply", {"name": "copy.pt"})
        assert (own.fields["format"], own.fields["gaussians"], own.fields["note"]) == ("4d", len(model), "")
        assert_same_model(read_dynamic(bytes(own.payload)), model)

        placement = np.eye(4)
        turn = 0.7
        placement[:3, :3] = 1.3 * np.array([[math.cos(turn), -math.sin(turn), 0], [math.sin(turn), math.cos(turn), 0],
                                             [0, 0, 1]])
        placement[:3, 3] = [0.5, -1.0, 2.0]
        moved = read_dynamic(bytes(client.request("export_ply", {"name": "moved.pt", "placement": placement}).payload))
        for time in (0.0, 0.6):
            at = client.request("export_ply", {"name": "at.ply", "time": time, "placement": placement})
            (tmp_path / "at.ply").write_bytes(at.payload)
            placed_then = read_ply(tmp_path / "at.ply")
            torch.testing.assert_close(moved.at(time).means, placed_then.means, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(moved.at(time).quats * torch.sign(moved.at(time).quats[:, :1]),
                                       placed_then.quats * torch.sign(placed_then.quats[:, :1]), atol=1e-5, rtol=1e-5)

        crop = box([0.0, 0.0, 0.0], [0.6, 0.6, 0.6])
        kept = inside(model.at(0.5).means.double().numpy(), crop)
        assert 5 < kept.sum() < len(model) - 5
        cropped = client.request("export_ply", {"name": "cropped.pt", "crop": crop, "time": 0.5})
        assert cropped.fields["gaussians"] == kept.sum() and "at time 0.5" in cropped.fields["note"]
        assert_same_model(read_dynamic(bytes(cropped.payload)),
                          type(model)(**{k: v[torch.from_numpy(kept)] for k, v in model.tensors().items()}))


def test_a_foreign_pt_file_and_a_static_models_pt_export_are_refused_in_one_line(viewer, tmp_path):
    import io
    from backend.formats.ply import write_ply
    still = random_gaussians(30, seed=4, sh_degree=0)
    write_ply(tmp_path / "still.ply", still)
    ply = (tmp_path / "still.ply").read_bytes()

    def torch_file(obj) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()
    with Client("127.0.0.1", viewer.port) as client:
        client.load_ply(ply, name="still.ply")
        for data, name, said in ((torch_file({"weights": torch.zeros(3)}), "weights.pt", "weights.pt: not a "
                                  "Splatwright 4D model (training on timed views writes splats4d.pt)"),
                                 (torch_file(torch.nn.Linear(2, 2)), "net.pt", "net.pt: not a Splatwright 4D model "
                                  "(a torch file of objects other than tensors; training on timed views writes "
                                  "splats4d.pt)"),
                                 (torch_file(torch.nn.Linear(2, 2)), "", "the uploaded model: not a Splatwright 4D "
                                  "model (a torch file of objects other than tensors"),
                                 (ply, "renamed.pt", "renamed.pt: not a Splatwright 4D model (not a torch file")):
            with pytest.raises(RemoteError) as e:
                client.load_ply(data, name=name)
            assert e.value.code == protocol.REJECTED and e.value.message.startswith(said), e.value.message
            assert "\n" not in e.value.message and len(e.value.message) < 200
        status = client.call("status")  # the model viewed before stays
        assert status["gaussians"] == len(still) and status["dynamic"] is False
        exported = client.request("export_ply", {"name": "still.ply", "time": 0.5})
        assert exported.fields["dynamic"] is False and exported.fields["gaussians"] == len(still)
        with pytest.raises(RemoteError, match=r"^still\.pt: the model shown is a static model, the same at every "
                                              r"time, and a \.pt file holds a 4D model") as e:
            client.request("export_ply", {"name": "still.pt"})
        assert e.value.code == protocol.REJECTED

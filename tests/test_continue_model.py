"""Training continues from a model the client sends with start_training (such as a native splat object a user
edited in Blender): the model replaces the session's, the run's step and schedule go on, Adam and the
densification statistics start over for it, and its checkpoints hold it; a model that cannot be continued from
is refused in one line. The server runs in this process on loopback (CPU)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from blender_addon.core.client import RemoteError
from backend.formats.ply import encode_ply
from backend.gaussians import Gaussians
from backend.service.limits import Limits
from backend.service.session import Session
from backend.train import TrainConfig, Trainer, load_checkpoint
from helpers import orbit_cameras, random_gaussians
from server_helpers import expected_frame, serving, wait_for

SESSION = "edited"
BACKGROUND = (1.0, 1.0, 1.0)
TRAINED, ITERATIONS = 5, 30  # the steps the session's checkpoint holds, and its schedule's
KEPT, MOVED, SHIFT = 150, 20, np.array([0.4, 0.0, 0.0], np.float32)  # the edit: rows kept, the first ones moved


def trained_session(workdir: Path) -> Gaussians:
    """A session whose checkpoint holds a model trained TRAINED of ITERATIONS steps (Adam's moments and the
    densification statistics of those steps with it); the model."""
    session = Session.open(workdir, SESSION, create=True)
    truth = random_gaussians(200, seed=4, sh_degree=1)
    for i, cam in enumerate(orbit_cameras(4, 16, 16)):
        session.add_view(cam, np.ascontiguousarray(expected_frame(truth, cam, 1, BACKGROUND)[::-1, :, :3]), f"v{i}")
    cfg = TrainConfig(iterations=ITERATIONS, sh_degree=1, sh_interval=1, log_every=1, background=BACKGROUND)
    trainer = Trainer(session.dataset(BACKGROUND), cfg, "cpu", truth.detached())
    while trainer.step < TRAINED:
        trainer.train_step()
    trainer.save_checkpoint(session.checkpoint_path)
    return trainer.g.detached()


def edited(model: Gaussians) -> Gaussians:
    """`model` as a user edits it: its last rows deleted, its first ones moved."""
    g = Gaussians(**{name: value[:KEPT].clone() for name, value in model.tensors().items()})
    g.means[:MOVED] += torch.from_numpy(SHIFT)
    return g


def test_training_continues_from_the_model_sent_and_checkpoints_it(tmp_path):
    model = edited(trained_session(tmp_path))
    checkpoint = tmp_path / SESSION / "checkpoint.pt"
    with serving(tmp_path) as client:
        client.call("open_session", name=SESSION, create=False)
        reply = client.request("start_training", {"progress_interval": 0.05, "checkpoint_every": 10},
                               encode_ply(model)).fields
        assert reply["continued"]
        events = []
        wait_for(client, lambda e: events.append(e) or (e["event"] == "state" and e["state"] == "finished"))
        status = client.call("status")
    progress = [e for e in events if e["event"] == "progress"]
    assert progress and {e["gaussians"] for e in progress} == {KEPT}  # every step trained the model sent
    # The steps go on from the checkpoint's (when the first report comes depends on the machine's load).
    assert progress[0]["step"] > TRAINED and status["step"] == ITERATIONS and status["gaussians"] == KEPT
    state = load_checkpoint(checkpoint)
    assert state["step"] == ITERATIONS and len(state["gaussians"]["means"]) == KEPT
    # Adam started over with the model sent: its step counts are the steps since, not the run's
    means = state["optimizer"]["param_groups"][0]["params"][0]
    assert state["optimizer"]["state"][means]["step"] == ITERATIONS - TRAINED
    trained = state["gaussians"]["means"].numpy()
    sent = model.means.numpy()
    moved = np.abs(trained - sent).max()
    print(f"{KEPT} Gaussians sent, {MOVED} moved by {SHIFT[0]:g}: the checkpoint at step {ITERATIONS} is within "
          f"{moved:.4f} of them")
    assert moved < 0.1  # the moved rows trained on from where they were sent, not from where they were
    assert len(load_checkpoint(tmp_path / SESSION / "checkpoint.prev.pt")["gaussians"]["means"]) == KEPT


@pytest.mark.parametrize("fields, payload, limits, said", [
    ({"fresh": True}, "model", Limits(), "send it without fresh"),
    ({}, "not a ply", Limits(), "the model to continue from: not a PLY file"),
    ({}, "model", Limits(model_splats=100), "--max-model-splats"),
], ids=["fresh", "not-a-ply", "over-the-cap"])
def test_a_model_that_cannot_be_continued_from_is_refused_in_one_line(tmp_path, fields, payload, limits, said):
    model = edited(trained_session(tmp_path))
    before = load_checkpoint(tmp_path / SESSION / "checkpoint.pt")
    data = encode_ply(model) if payload == "model" else payload.encode()
    with serving(tmp_path, limits=limits) as client:
        client.call("open_session", name=SESSION, create=False)
        with pytest.raises(RemoteError) as refused:
            client.request("start_training", fields, data)
        assert said in refused.value.message and "\n" not in refused.value.message
        status = client.call("status")
        assert status["state"] == "idle" and status["step"] == 0
    after = load_checkpoint(tmp_path / SESSION / "checkpoint.pt")
    assert after["step"] == before["step"] and len(after["gaussians"]["means"]) == len(before["gaussians"]["means"])


def test_a_session_without_a_trained_model_refuses_a_model_to_continue_from(tmp_path):
    session = Session.open(tmp_path, "new", create=True)
    cam = orbit_cameras(1, 16, 16)[0]
    session.add_view(cam, np.full((16, 16, 3), 200, np.uint8), "v0")
    with serving(tmp_path) as client:
        client.call("open_session", name="new", create=False)
        with pytest.raises(RemoteError) as refused:
            client.request("start_training", {}, encode_ply(random_gaussians(10, sh_degree=1)))
    assert "has no trained model for the model sent to replace" in refused.value.message


def test_a_4d_session_refuses_a_static_model_to_continue_from(tmp_path):
    session = Session.open(tmp_path, "moving", create=True)
    for i, cam in enumerate(orbit_cameras(2, 16, 16)):
        session.add_view(cam, np.full((16, 16, 3), 200, np.uint8), f"v{i}", time=float(i))
    with serving(tmp_path) as client:
        client.call("open_session", name="moving", create=False)
        client.call("start_training", iterations=2, init_points=50)
        wait_for(client, lambda e: e["event"] == "state" and e["state"] == "finished")
        with pytest.raises(RemoteError) as refused:
            client.request("start_training", {}, encode_ply(random_gaussians(10, sh_degree=1)))
    assert "trains a 4D model" in refused.value.message

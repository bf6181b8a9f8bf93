"""Training for an image formation (backend/render/formation.py): the trainer fits a scene drawn in Blender's, a
model remembers its formation in its checkpoint and its PLY, and a GPU, whose kernels draw the standard formation
only, trains in that one and says so in one line (on the CPU, the rasterizer choice "cuda" faked)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from plyfile import PlyData

from blender_addon.core.client import decode_frame
from blender_addon.core.settings import default, training_settings
from backend.data import load_split
from backend.formats import formation_of, notes, write_any
from backend.formats.ply import encode_ply, read_ply, write_ply
from backend.policy import make_config
from backend.render import render
from backend.tools import commands
from backend.tools.cli import main as cli
from backend.train import Trainer, evaluate, load_checkpoint
from helpers import formation_config, orbit_cameras, random_gaussians
from server_helpers import add_scene_views, serving, wait_for


def test_the_settings_table_states_the_formation_and_the_addon_on_blender_5_3_asks_for_blender():
    assert default("image_formation") == "standard"  # the backend's and the CLI's
    assert default("image_formation", "blender-5.3") == "blender"
    cfg = make_config("cpu", "reference", training_settings(image_formation="blender"))
    assert cfg.image_formation == "blender"


def test_training_in_blender_formation_fits_a_scene_drawn_in_it(blender_scene):
    """100 steps from 300 random Gaussians (at most 800) reach about 23 dB on the held-out views, from 16."""
    train, test = load_split(blender_scene, "train"), load_split(blender_scene, "test")
    trainer = Trainer(train, formation_config(100, "blender"))
    assert trainer.note == ""
    before = evaluate(trainer.g, test, 0, (1, 1, 1), "reference", "blender")["psnr"]
    while trainer.step < 100:
        trainer.train_step()
    after = evaluate(trainer.g, test, trainer.sh_degree, (1, 1, 1), "reference", "blender")["psnr"]
    assert after > 21 and after > before + 5, (before, after)


def test_a_checkpoint_remembers_the_formation_and_resuming_keeps_it(blender_scene, tmp_path):
    train = load_split(blender_scene, "train")
    trainer = Trainer(train, formation_config(4, "blender"))
    while trainer.step < 2:
        trainer.train_step()
    trainer.save_checkpoint(tmp_path / "ck.pt")
    state = load_checkpoint(tmp_path / "ck.pt")
    assert state["config"]["image_formation"] == "blender"
    # Resumed with settings that name another formation (the CLI's defaults, say), it trains on in its own.
    resumed = Trainer.from_checkpoint(train, state, "cpu", formation_config(4, "standard"))
    assert resumed.cfg.image_formation == "blender"
    assert "trained in image formation 'blender', and training goes on in it" in resumed.note
    assert Trainer.from_checkpoint(train, state, "cpu").note == ""


def test_a_gpu_trains_a_blender_model_in_the_standard_formation_and_says_so(blender_scene):
    trainer = Trainer(load_split(blender_scene, "train"), replace(formation_config(4, "blender"), rasterizer="cuda"))
    assert trainer.cfg.image_formation == "standard"
    assert "image formation 'blender' is not in the CUDA kernels yet" in trainer.note
    assert Trainer(load_split(blender_scene, "train"),
                   replace(formation_config(4, "standard"), rasterizer="cuda")).note == ""


def test_the_cli_says_in_one_line_on_stderr_that_a_gpu_trains_the_standard_formation(blender_scene, tmp_path,
                                                                                     monkeypatch, capsys):
    monkeypatch.setattr(commands, "resolve_device", lambda name: ("cpu", "cuda"))
    monkeypatch.setattr(commands, "run_training", lambda *args: True)
    monkeypatch.setattr(commands, "finish", lambda trainer, *args, **kw: {"image_formation": trainer.cfg.image_formation})
    assert cli(["train", str(blender_scene), "--out", str(tmp_path / "out"), "--image-formation", "blender",
                "--random-init", "--iterations", "2"]) == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if "image formation" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: image formation 'blender' is not in the CUDA kernels")
    assert json.loads(out.strip().splitlines()[-1]) == {"image_formation": "standard"}


def test_the_server_warns_once_that_a_gpu_trains_the_standard_formation(tmp_path, scene, monkeypatch):
    def step(self):  # a step without the kernels: the trainer's set-up is what is under test
        self.step += 1
    monkeypatch.setattr(Trainer, "train_step", step)
    with serving(tmp_path, "cpu", "cuda") as client:
        client.call("open_session", name="native")
        add_scene_views(client, scene)
        client.call("start_training", iterations=5, init_points=100, image_formation="blender")
        warning = wait_for(client, lambda e: e["event"] == "warning")
        assert "image formation 'blender' is not in the CUDA kernels yet" in warning["message"]
        assert wait_for(client, lambda e: e["event"] == "state" and e["state"] == "finished")
        assert client.call("status")["settings"]["image_formation"] == "blender"  # as asked
    assert load_checkpoint(tmp_path / "native" / "checkpoint.pt")["config"]["image_formation"] == "standard"


def test_the_ply_names_a_blender_models_formation_in_a_comment_other_readers_ignore(tmp_path):
    g = random_gaussians(20, seed=3, sh_degree=2)
    data = encode_ply(g, "blender")
    assert b"comment splatwright image_formation blender\n" in data[:data.index(b"end_header")]
    assert formation_of(data) == "blender"
    assert encode_ply(g) == encode_ply(g, "standard") and formation_of(encode_ply(g)) == "standard"
    back = read_ply(data)
    for name, t in g.tensors().items():
        assert torch.equal(getattr(back, name), t), name
    write_ply(tmp_path / "m.ply", g, "blender")
    assert formation_of(tmp_path / "m.ply") == "blender"
    assert PlyData.read(str(tmp_path / "m.ply"))["vertex"].count == 20


def test_exporting_a_blender_model_says_what_changes_for_other_viewers(tmp_path):
    g = random_gaussians(20, seed=3, sh_degree=0)
    assert notes(g, "ply") == [] and notes(g, "spz", "standard") == []
    [ply_note] = write_any(tmp_path / "m.ply", g, "blender")
    assert "its PLY comment names it" in ply_note and "other 3DGS viewers" in ply_note
    [spz_note] = write_any(tmp_path / "m.spz", g, "blender")
    assert "no place to say so" in spz_note
    assert formation_of(tmp_path / "m.spz") == "standard"


def test_an_unknown_formation_in_a_ply_is_refused_naming_it():
    data = encode_ply(random_gaussians(3), "blender").replace(b"image_formation blender", b"image_formation filmic")
    with pytest.raises(Exception, match="'filmic'"):
        formation_of(data, "m.ply")


def test_cli_training_in_blender_formation_writes_the_comment_and_renders_in_it(blender_scene, tmp_path):
    out = tmp_path / "out"
    assert cli(["train", str(blender_scene), "--out", str(out), "--image-formation", "blender", "--random-init",
                "--iterations", "3", "--init-points", "200", "--device", "cpu"]) == 0
    assert formation_of(out / "splats.ply") == "blender"
    assert json.loads((out / "metrics.json").read_text())["image_formation"] == "blender"


def test_the_server_draws_and_exports_a_blender_model_in_its_formation(tmp_path, scene):
    """A trained model and an imported file are drawn in the image formation they were made for; an export keeps
    it in the PLY and says what changes for other viewers."""
    model = random_gaussians(80, seed=4, sh_degree=1)
    background = (0.1, 0.2, 0.3)
    cam = orbit_cameras(1, 24, 24)[0]
    with torch.no_grad():
        out = render(model, cam, 1, background, formation="blender")
    expected = (torch.cat([out.image, out.alpha[..., None]], -1).clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()
    with serving(tmp_path) as client:
        client.load_ply(encode_ply(model, "blender"), background, "native.ply")
        assert np.array_equal(decode_frame(client.request("render", {"camera": cam})), expected[::-1])
        exported = client.request("export_ply", {"name": "again.spz"})
        assert "Blender's image formation" in exported.fields["note"]
        client.call("open_session", name="trained")
        add_scene_views(client, scene)
        client.call("start_training", iterations=3, init_points=100, image_formation="blender")
        assert wait_for(client, lambda e: e["event"] == "state" and e["state"] == "finished")
        exported = client.request("export_ply", {"name": "trained.ply"})
        assert formation_of(bytes(exported.payload)) == "blender" and "PLY comment" in exported.fields["note"]


def test_convert_carries_the_formation_and_says_what_other_formats_lose(tmp_path, capsys):
    write_ply(tmp_path / "native.ply", random_gaussians(30, seed=2, sh_degree=1), "blender")
    assert cli(["convert", str(tmp_path / "native.ply"), str(tmp_path / "copy.ply")]) == 0
    assert formation_of(tmp_path / "copy.ply") == "blender"
    assert cli(["convert", str(tmp_path / "native.ply"), str(tmp_path / "copy.spz")]) == 0
    assert "no place to say so" in capsys.readouterr().err

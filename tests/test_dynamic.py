"""4D Gaussians (backend.dynamic): timed datasets, the model's time dependence and its gradients, 4D training
against a static model on a small moving scene (in the standard formation, and in Blender's on the CPU),
checkpoints and the command line."""
import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from backend.tools import cli
from backend.data import load_split
from backend.dynamic import DynamicGaussians, read_dynamic, split_in_time
from backend.gaussians import Gaussians
from backend.optim import Adam
from backend.policy import cpu_config
from backend.render import camera_tensors, reference, render
from backend.strategy import DefaultStrategy, DensifyConfig
from backend.train import Trainer, evaluate, load_checkpoint
from blender_addon.core.errors import SplatwrightError
from helpers import ROOT, orbit_cameras, random_gaussians, write_scene
from server_helpers import wait_for

TRAIN_TIMES = (0.0, 0.25, 0.5, 0.75, 1.0)
TEST_TIMES = (0.125, 0.375, 0.625, 0.875)  # between the training times, seen by other cameras


def moving_model() -> DynamicGaussians:
    """60 Gaussians moving in straight lines, each 0.8 m over the clip (about 9 pixels in 32x32 views)."""
    model = DynamicGaussians.from_static(random_gaussians(60, seed=2, sh_degree=0, scale=0.12))
    directions = torch.randn(len(model), 3, generator=torch.Generator().manual_seed(5))
    model.velocities = 0.8 * torch.nn.functional.normalize(directions, dim=-1)
    return model


def write_timed_scene(folder, model: DynamicGaussians, cameras, times, split: str, formation: str = "standard") -> None:
    """A D-NeRF-layout split drawn in an image formation: every camera at every time, each frame with its `time`."""
    frames = []
    for k, t in enumerate(times):
        path = write_scene(folder, model.at(t), cameras, f"{split}_{k}", formation=formation)
        meta = json.loads(path.read_text())
        frames += [{**frame, "time": t} for frame in meta["frames"]]
        path.unlink()
    (folder / f"transforms_{split}.json").write_text(json.dumps({**meta, "frames": frames}))


def moving_views(folder, formation: str = "standard"):
    """32x32 views of moving_model in an image formation: 6 cameras at 5 times to train on, 3 others at 4 other
    times to test."""
    model = moving_model()
    write_timed_scene(folder, model, orbit_cameras(6, 32, 32), TRAIN_TIMES, "train", formation)
    write_timed_scene(folder, model, orbit_cameras(3, 32, 32, radius=3.2), TEST_TIMES, "test", formation)
    return folder


@pytest.fixture(scope="module")
def moving_scene(tmp_path_factory):
    return moving_views(tmp_path_factory.mktemp("moving"))


def training_config(iterations: int):
    """The CPU schedule, small: motion rates 20x the defaults, so that a few dozen steps learn 0.8 m of motion."""
    cfg = cpu_config(iterations)
    lr = replace(cfg.lr, velocities=20 * cfg.lr.velocities, accelerations=20 * cfg.lr.accelerations)
    return replace(cfg, init_points=500, sh_degree=0, log_every=10, lr=lr,
                   densify=replace(cfg.densify, start=10, every=20, stop=int(0.8 * iterations),
                                   reset_opacity_every=0, max_gaussians=1500))


def test_a_dnerf_folder_loads_with_its_times(moving_scene, tmp_path):
    train = load_split(moving_scene, "train")
    assert len(train) == 30 and train.times == [t for t in TRAIN_TIMES for _ in range(6)]
    assert train.time(7) == 0.25
    write_scene(tmp_path, random_gaussians(20), orbit_cameras(2, 16, 16))
    static = load_split(tmp_path, "train")
    assert static.times is None and static.time(1) == 0.0

    meta = json.loads((tmp_path / "transforms_train.json").read_text())
    meta["frames"][0]["time"] = 0.5
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))
    with pytest.raises(SplatwrightError, match="view 1 has no time but other views do"):
        load_split(tmp_path, "train")
    meta["frames"][1]["time"] = 1.5
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))
    with pytest.raises(SplatwrightError, match=r"frame 1: time must be a number in \[0, 1\]"):
        load_split(tmp_path, "train")


def test_without_motion_the_model_is_its_static_part_at_every_time():
    static = random_gaussians(50, seed=4, sh_degree=1)
    model = DynamicGaussians.from_static(static)
    cam = orbit_cameras(1, 24, 24)[0]
    image = render(static, cam, 1, (1.0, 1.0, 1.0)).image
    for t in (0.0, 0.3, 1.0):
        now = model.at(t)
        assert type(now) is Gaussians
        for name, tensor in static.tensors().items():
            assert torch.equal(getattr(now, name), tensor), (t, name)
        assert torch.equal(render(now, cam, 1, (1.0, 1.0, 1.0)).image, image)


def test_motion_moves_turns_and_fades_the_gaussians():
    model = DynamicGaussians.from_static(random_gaussians(3, seed=1, sh_degree=0))
    model.quats = torch.tensor([[1.0, 0, 0, 0]] * 3)
    model.velocities = torch.tensor([[1.0, 0, 0], [0, 2, 0], [0, 0, 0]])
    model.accelerations = torch.tensor([[0, 0, 4.0], [0, 0, 0], [0, 0, 0]])
    model.angular_velocities = torch.tensor([[0, 0, math.pi], [0, 0, 0], [0, 0, 0]])
    model.time_centers = torch.tensor([0.5, 0.25, 0.5])
    model.time_precisions = torch.tensor([0.0, 0.0, 8.0])
    now = model.at(1.0)
    expected = model.means + torch.tensor([[0.5, 0, 0.5], [0, 1.5, 0], [0, 0, 0]])  # v dt + a dt^2 / 2
    torch.testing.assert_close(now.means, expected)
    # Half a second at pi rad/s about z: a quarter turn.
    torch.testing.assert_close(now.quats[0], torch.tensor([math.cos(math.pi / 4), 0, 0, math.sin(math.pi / 4)]))
    torch.testing.assert_close(now.opacities, model.opacities * torch.tensor([1.0, 1.0, math.exp(-1.0)]))


def test_motion_gradients_match_finite_differences():
    """Through at(t) and the reference rasterizer, in float64; the motion is far from zero."""
    gen = torch.Generator().manual_seed(3)
    static = random_gaussians(6, seed=7, sh_degree=1, scale=0.3).to(dtype=torch.float64)
    cam = orbit_cameras(1, 20, 18, radius=2.5)[0]
    viewmat, K = camera_tensors(cam, "cpu", torch.float64)
    weights = torch.rand(18, 20, 3, dtype=torch.float64, generator=gen)

    def f(velocities, accelerations, angular_velocities, time_centers, time_precisions):
        model = DynamicGaussians(**static.tensors(), velocities=velocities, accelerations=accelerations,
                                 angular_velocities=angular_velocities, time_centers=time_centers,
                                 time_precisions=time_precisions)
        now = model.at(0.8)
        out = reference.rasterize(now.means, now.quats, torch.exp(now.log_scales), now.opacities, now.sh,
                                  viewmat, K, 20, 18, 1, (0.3, 0.3, 0.3))
        return (out.image * weights).sum()

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=gen)
    motion = (0.3 * rand(6, 3), 0.5 * rand(6, 3), rand(6, 3), 0.5 + 0.2 * rand(6), 4 * rand(6).abs())
    inputs = tuple(t.requires_grad_() for t in motion)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_split_in_time_keeps_each_child_on_its_parents_trajectory():
    parent = moving_model()
    gen = torch.Generator().manual_seed(8)
    parent.accelerations = 0.5 * torch.randn(len(parent), 3, generator=gen)
    parent.angular_velocities = 2.0 * torch.randn(len(parent), 3, generator=gen)
    parent.time_precisions = torch.where(torch.arange(len(parent)) % 2 == 0, 40.0, 0.0)  # half seen always
    children = DynamicGaussians(**split_in_time(parent.tensors(), lambda shape: torch.randn(shape, generator=gen), 1.6))
    windowed = parent.time_precisions > 0
    assert (children.time_centers[windowed] != parent.time_centers[windowed]).all()
    assert torch.equal(children.time_centers[~windowed], parent.time_centers[~windowed])
    torch.testing.assert_close(children.time_precisions, parent.time_precisions * 1.6 ** 2)
    for t in (0.0, 0.4, 1.0):
        now, then = children.at(t), parent.at(t)
        torch.testing.assert_close(now.means, then.means, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(now.quats, then.quats, atol=1e-5, rtol=1e-5)


def test_pruning_keeps_what_some_captured_time_sees():
    """A Gaussian seen only outside the captured times is pruned; the same one seen within them is kept."""
    model = DynamicGaussians.from_static(random_gaussians(3, seed=1, sh_degree=0))
    model.opacity_logits = torch.full((3,), 2.0)
    model.time_centers = torch.tensor([0.5, 1.6, -0.05])
    model.time_precisions = torch.tensor([50.0, 50.0, 50.0])
    peak = model.peak_opacities()
    torch.testing.assert_close(peak[0], torch.sigmoid(torch.tensor(2.0)))
    assert peak[1] < 1e-3 < peak[2]
    cfg = DensifyConfig(start=0, stop=10, every=1, reset_opacity_every=0, prune_opacity=0.005)
    strategy = DefaultStrategy(cfg, extent=1.0)
    strategy.grad_sum, strategy.count = torch.zeros(3), torch.ones(3)
    model.requires_grad_()
    optimizer = Adam([{"params": [t], "lr": 0.0, "name": name} for name, t in model.tensors().items()])
    strategy.refine(1, model, optimizer, torch.Generator())
    torch.testing.assert_close(model.time_centers.detach(), torch.tensor([0.5, -0.05]))


def static_and_4d(folder, steps: int, formation: str = "standard") -> dict[str, float]:
    """Held-out PSNRs (in `formation`) of a static and a 4D model trained `steps` steps in `formation` on a moving
    scene, both from its Gaussians where they are at its middle time, without densification."""
    train, test = load_split(folder, "train"), load_split(folder, "test")
    cfg = replace(training_config(steps), image_formation=formation)
    cfg = replace(cfg, densify=replace(cfg.densify, start=cfg.iterations))
    middle = moving_model()
    middle = Gaussians(**{name: getattr(middle, name) for name in Gaussians.names()})
    scores = {}
    for name, data in (("static", replace(train, times=None)), ("4d", train)):
        trainer = Trainer(data, cfg, gaussians=middle.detached())
        assert trainer.dynamic == (name == "4d") and trainer.cfg.image_formation == formation
        while trainer.step < cfg.iterations:
            trainer.train_step()
        scores[name] = evaluate(trainer.g, test, 0, (1.0, 1.0, 1.0), "reference", formation)["psnr"]
    assert (trainer.g.time_precisions >= 0).all()
    return scores


def test_a_4d_model_fits_a_moving_scene_far_better_than_a_static_one(moving_scene):
    scores = static_and_4d(moving_scene, 50)
    # Measured: static 23.8 dB, 4D 34.5 dB on held-out cameras at held-out times.
    assert scores["4d"] > scores["static"] + 6.0, scores


def test_a_4d_model_trains_in_blenders_image_formation_on_the_cpu(tmp_path):
    """The reference path draws the 4D model at each view's time in Blender's formation (linear-light blending,
    as a native 4D object is drawn), so it fits a moving scene drawn in it."""
    scores = static_and_4d(moving_views(tmp_path, "blender"), 30, "blender")
    # Measured: static 26.1 dB, 4D 30.7 dB on held-out cameras at held-out times, in Blender's formation.
    assert scores["4d"] > scores["static"] + 3.0, scores


def test_densification_clones_and_splits_the_motion_with_the_rest(moving_scene):
    trainer = Trainer(load_split(moving_scene, "train"), replace(training_config(40), init_points=50))
    g = trainer.g
    with torch.no_grad():
        g.velocities.copy_(torch.randn(g.velocities.shape, generator=torch.Generator().manual_seed(1)))
    velocities = g.velocities.detach().clone()
    strategy = trainer.strategy
    strategy.grad_sum, strategy.count = torch.ones(len(g)), torch.ones(len(g))  # every Gaussian grows
    strategy.refine(strategy.cfg.every, g, trainer.optimizer, trainer.generator)
    assert len(g) > 50
    optimized = {group["name"]: group["params"][0] for group in trainer.optimizer.param_groups}
    for name, tensor in g.tensors().items():
        assert tensor.shape[0] == len(g) and optimized[name] is tensor, name
    # Every Gaussian now is one of the first ones, with its velocity: cloned, or split into two.
    assert all((velocities == v).all(dim=1).any() for v in g.velocities.detach())


def test_a_4d_checkpoint_resumes_exactly(moving_scene, tmp_path):
    data = load_split(moving_scene, "train")
    cfg = replace(training_config(30), init_points=100)
    straight = Trainer(data, cfg)
    while straight.step < 30:
        straight.train_step()
    first = Trainer(data, cfg)
    while first.step < 15:  # before the densification at step 20
        first.train_step()
    first.save_checkpoint(tmp_path / "ck.pt")
    resumed = Trainer.from_checkpoint(data, load_checkpoint(tmp_path / "ck.pt"), "cpu")
    assert resumed.dynamic
    while resumed.step < 30:
        resumed.train_step()
    assert set(straight.g.tensors()) >= {"velocities", "angular_velocities", "time_precisions"}
    for name, t in straight.g.tensors().items():
        assert torch.equal(getattr(resumed.g, name), t), name


def test_a_static_checkpoint_does_not_resume_as_4d(moving_scene, tmp_path):
    data = load_split(moving_scene, "train")
    Trainer(replace(data, times=None), training_config(10)).save_checkpoint(tmp_path / "ck.pt")
    with pytest.raises(SplatwrightError, match="holds a static model, but these views have times"):
        Trainer.from_checkpoint(data, load_checkpoint(tmp_path / "ck.pt"), "cpu")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "backend", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_cli_trains_4d_on_timed_views_and_renders_any_time(moving_scene, tmp_path, capsys):
    out = tmp_path / "run"
    r = run_cli("train", str(moving_scene), "--out", str(out), "--device", "cpu", "--iters", "30",
                "--init-points", "300", "--sh-degree", "0")
    assert r.returncode == 0, r.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["psnr"] > 10 and metrics["iterations"] == 30
    model = read_dynamic(out / "splats4d.pt")
    assert len(model) == metrics["gaussians"] and (out / "splats.ply").is_file()

    cameras = str(moving_scene / "transforms_train.json")
    for t in ("0", "1"):
        assert cli.main(["render", str(out / "splats4d.pt"), "--cameras", cameras, "--out", str(tmp_path / t),
                         "--device", "cpu", "--time", t]) == 0
    # A camera's frames at all times share one name (train_0/r_0, train_1/r_0, ...), so one file each.
    first, last = (np.asarray(Image.open(tmp_path / t / "r_0.png")) for t in ("0", "1"))
    assert first.shape == (32, 32, 3) and (first != last).any()
    assert cli.main(["render", str(out / "splats.ply"), "--cameras", cameras, "--out", str(tmp_path / "static"),
                     "--device", "cpu", "--time", "0.5"]) == 1
    assert "is a static model, the same at every time" in capsys.readouterr().err


def test_timed_views_sent_to_the_server_train_a_4d_model_it_shows_at_any_time(moving_scene, tmp_path):
    """Views with times (as the add-on's captures over time send them) make the session dynamic: training
    through the server fits a 4D model, renders at two times differ, and the reopened session keeps the times."""
    import threading

    from backend.service.engine import Engine
    from backend.service.server import Server
    from backend.service.session import Session
    from blender_addon.core.client import Client, decode_frame
    data = load_split(moving_scene, "train")
    server = Server(Engine(tmp_path, "cpu", "reference"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Client("127.0.0.1", server.port) as client:
            client.call("open_session", name="moving")
            for cam, image, name, t in zip(data.cameras, data.images, data.names, data.times):
                pixels = image.numpy()[::-1]  # the stored uint8 view, rows bottom-up as Blender's
                client.add_view(cam, np.ascontiguousarray(pixels), name, t)
            client.call("start_training", iterations=40, sh_degree=0, max_gaussians=800, progress_interval=0.1)
            wait_for(client, lambda e: e["event"] == "state" and e["state"] == "finished", timeout=300)
            frames = [decode_frame(client.request("render", {"camera": data.cameras[0], "time": t}))
                      for t in (0.0, 1.0)]
    finally:
        server.stop()
        thread.join(30)
    assert not np.array_equal(*frames)  # a static model looks the same at every time
    reopened = Session.open(tmp_path, "moving", create=False)
    assert reopened.dataset((1.0, 1.0, 1.0)).times == pytest.approx(data.times)
    assert isinstance(load_checkpoint_model(reopened.checkpoint_path), DynamicGaussians)


def load_checkpoint_model(path):
    from backend.dynamic import gaussians_from_tensors
    return gaussians_from_tensors(load_checkpoint(path)["gaussians"])


def test_cli_converts_a_4d_model_to_a_ply_sequence_one_file_per_frame(tmp_path):
    """convert --frames N: N official-layout PLYs (name_0001.ply ...) at evenly spaced times, each reading
    back as the model at its time; a static model with --frames, and no --frames, say what they do."""
    from backend.dynamic import write_dynamic
    from backend.formats.ply import read_ply, write_ply
    model = moving_model()
    write_dynamic(tmp_path / "splats4d.pt", model)
    r = run_cli("convert", str(tmp_path / "splats4d.pt"), str(tmp_path / "seq" / "moving.ply"), "--frames", "3")
    assert r.returncode == 0, r.stderr
    paths = sorted((tmp_path / "seq").glob("*.ply"))
    assert [p.name for p in paths] == ["moving_0001.ply", "moving_0002.ply", "moving_0003.ply"]
    for path, t in zip(paths, (0.0, 0.5, 1.0)):
        np.testing.assert_allclose(read_ply(path).means.numpy(), model.at(t).means.numpy(), atol=1e-6)
    r = run_cli("convert", str(tmp_path / "splats4d.pt"), str(tmp_path / "sh0" / "moving.ply"), "--frames", "2",
                "--sh-degree", "0")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(read_ply(tmp_path / "sh0" / "moving_0002.ply").means.numpy(),
                               model.at(1.0).means.numpy(), atol=1e-6)
    r = run_cli("convert", str(tmp_path / "splats4d.pt"), str(tmp_path / "first.spz"))
    assert r.returncode == 0 and "holds its first frame" in r.stderr
    write_ply(tmp_path / "still.ply", random_gaussians(10, seed=1))
    r = run_cli("convert", str(tmp_path / "still.ply"), str(tmp_path / "x.ply"), "--frames", "3")
    assert r.returncode != 0 and "--frames: " in r.stderr and "is a static model" in r.stderr

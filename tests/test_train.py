import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from backend.policy import cpu_config
from backend.data.dataset import Dataset, scene_bounds
from backend.data import load_split, scene_point_cloud
from blender_addon.core.errors import SplatwrightError
from backend.gaussians import Gaussians, rgb_to_sh_dc
from backend.optim import Adam
from backend.formats.ply import read_ply
from blender_addon.core.points import POINTS_FILE, write_points
from backend.strategy import DefaultStrategy, edit_rows
from backend.metrics import photometric_loss
from backend.train import Trainer, evaluate, fit_to_views, load_checkpoint, mean_scores, warm_up, with_steps
from helpers import MIXED_SIZES, ROOT, cameras_of_sizes, orbit_cameras, random_gaussians, write_scene


def small_config(iterations: int):
    cfg = cpu_config(iterations)
    # Capped: on 32x32 views densification would grow 500 Gaussians to 12k in 120 steps.
    return replace(cfg, init_points=500, sh_interval=20, log_every=10,
                   densify=replace(cfg.densify, start=10, every=10, stop=iterations, reset_opacity_every=30,
                                   max_gaussians=2000))


def test_training_improves_the_fit(tiny_scene):
    data = load_split(tiny_scene, "train")
    trainer = Trainer(data, small_config(120))
    before = evaluate(trainer.g, data, 0, (1, 1, 1), "reference")["psnr"]
    while trainer.step < 120:
        trainer.train_step()
    after = evaluate(trainer.g, data, trainer.sh_degree, (1, 1, 1), "reference")["psnr"]
    assert after > before + 3, (before, after)
    assert trainer.sh_degree == 3  # grew one degree every 20 steps up to the maximum


def test_a_random_start_has_the_views_mean_colour_and_fills_their_region(tiny_scene):
    data = load_split(tiny_scene, "train")
    g = Trainer(data, small_config(10)).g
    expected = rgb_to_sh_dc(torch.tensor(data.mean_color()))
    assert torch.allclose(g.sh_dc.detach()[:, 0], expected.expand(len(g), 3), atol=1e-6)
    center, half = scene_bounds(data.cameras)
    assert len(g) == 500 and bool((g.means.detach() - torch.tensor(center).float()).abs().max() <= half + 1e-5)


def test_cpu_training_repeats_exactly(tmp_path):
    """Two runs give the same model bit for bit. Large enough (8000 splats over 64x64 views) that torch's
    multi-threaded CPU kernels take their parallel paths, where advanced-indexing gathers (t[ids]) would sum
    their gradients in a varying order; the reference rasterizer gathers with index_select instead."""
    write_scene(tmp_path, random_gaussians(300, seed=1, sh_degree=1), orbit_cameras(4, 64, 64), "train")
    data = load_split(tmp_path, "train")
    cfg = replace(cpu_config(4), init_points=8000)
    runs = []
    for _ in range(2):
        trainer = Trainer(data, cfg)
        while trainer.step < cfg.iterations:
            trainer.train_step()
        runs.append(trainer.g)
    for name, t in runs[0].tensors().items():
        assert torch.equal(getattr(runs[1], name), t), name


def test_resume_continues_exactly(tiny_scene, tmp_path):
    data = load_split(tiny_scene, "train")
    cfg = small_config(60)
    straight = Trainer(data, cfg)
    while straight.step < 60:
        straight.train_step()

    first = Trainer(data, cfg)
    while first.step < 25:  # stop between densification steps, after an opacity reset is due later
        first.train_step()
    first.save_checkpoint(tmp_path / "ck.pt")
    resumed = Trainer.from_checkpoint(data, load_checkpoint(tmp_path / "ck.pt"), "cpu")
    while resumed.step < 60:
        resumed.train_step()
    assert len(resumed.g) == len(straight.g)
    for name, t in straight.g.tensors().items():  # training is deterministic, on every thread count
        assert torch.equal(getattr(resumed.g, name), t), name


def test_edit_rows_keeps_optimizer_state_in_step_with_rows():
    g = Gaussians.random_in_box(5, [0, 0, 0], 1.0, sh_degree=1, seed=0).requires_grad_()
    opt = Adam([{"params": [t], "name": n} for n, t in g.tensors().items()])
    sum(t.sum() * (i + 1) for i, t in enumerate(g.tensors().values())).backward()
    opt.step()
    before = {n: opt.state[t]["exp_avg"].clone() for n, t in g.tensors().items()}
    keep = torch.tensor([True, False, True, True, False])
    edit_rows(opt, g, keep=keep, append={n: t.detach()[:2] for n, t in g.tensors().items()})
    assert len(g) == 5
    for group in opt.param_groups:
        name, p = group["name"], group["params"][0]
        assert p is getattr(g, name) and p.requires_grad
        state = opt.state[p]["exp_avg"]
        assert state.shape == p.shape
        torch.testing.assert_close(state[:3], before[name][keep])
        assert torch.all(state[3:] == 0)


def test_adam_matches_torch_adam():
    """The trainer's Adam (CPU arithmetic; tests/test_cuda_training.py holds the kernel to it) follows
    torch.optim.Adam step for step, including for a strided gradient."""
    gen = torch.Generator().manual_seed(0)
    ours_params = [torch.randn(7, 3, generator=gen, dtype=torch.float64), torch.randn(5, generator=gen,
                                                                                     dtype=torch.float64)]
    torch_params = [p.clone() for p in ours_params]
    ours = Adam([{"params": [p], "lr": lr} for p, lr in zip(ours_params, (1e-2, 3e-3))], eps=1e-15)
    reference = torch.optim.Adam([{"params": [p], "lr": lr} for p, lr in zip(torch_params, (1e-2, 3e-3))],
                                 eps=1e-15)
    for _ in range(30):
        grads = [torch.randn(7, 6, generator=gen, dtype=torch.float64)[:, ::2],
                 torch.randn(5, generator=gen, dtype=torch.float64)]
        for params in (ours_params, torch_params):
            for p, g in zip(params, grads):
                p.grad = g.clone()
        ours.step()
        reference.step()
    for a, b in zip(ours_params, torch_params):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_gaussian_cap_is_respected(tiny_scene):
    data = load_split(tiny_scene, "train")
    cfg = small_config(60)
    cfg = replace(cfg, densify=replace(cfg.densify, max_gaussians=520, grad_threshold=1e-7))
    trainer = Trainer(data, cfg)
    while trainer.step < 60:
        trainer.train_step()
        assert len(trainer.g) <= 520


def test_a_schedule_stretches_to_its_steps_per_view(tiny_scene):
    """Many views stretch the steps, the end of densification and the reset period alike; few keep them; the
    trainer runs and checkpoints the stretched schedule, which a resume does not stretch again; views over time
    keep the schedule."""
    cfg = replace(small_config(60), min_steps_per_view=15)
    cfg = replace(cfg, densify=replace(cfg.densify, stop=40, reset_opacity_every=20))
    stretched = fit_to_views(cfg, 8)  # 120 steps: twice the 60
    assert (stretched.iterations, stretched.densify.stop, stretched.densify.reset_opacity_every) == (120, 80, 40)
    assert stretched.densify.start == cfg.densify.start and stretched.min_steps_per_view == 0
    assert fit_to_views(cfg, 3) == replace(cfg, min_steps_per_view=0)
    assert fit_to_views(with_steps(cfg, 30), 8).iterations == 30  # a chosen count runs as it is
    data = load_split(tiny_scene, "train")
    trainer = Trainer(data, cfg)
    assert trainer.cfg == stretched
    assert fit_to_views(trainer.cfg, 100) == stretched
    over_time = Dataset(data.cameras, data.images, data.names, [i / 7 for i in range(8)])  # cameras at times
    assert Trainer(over_time, cfg).cfg == replace(cfg, min_steps_per_view=0)


def test_the_warm_up_runs_every_kind_of_step(monkeypatch):
    """What a process would otherwise do at its first training's first densification and opacity reset."""
    calls = {"_densify": 0, "_reset_opacity": 0}
    for name in calls:
        original = getattr(DefaultStrategy, name)

        def counted(self, *args, name=name, original=original):
            calls[name] += 1
            return original(self, *args)
        monkeypatch.setattr(DefaultStrategy, name, counted)
    assert warm_up("cpu") > 0
    assert calls["_densify"] >= 2 and calls["_reset_opacity"] >= 1


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "backend", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_train_writes_ply_and_metrics(tiny_scene, tmp_path):
    out = tmp_path / "out"
    r = run_cli("train", tiny_scene, "--out", out, "--iters", 30, "--device", "cpu", "--init-points", 300)
    assert r.returncode == 0, r.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) >= {"psnr", "ssim", "iterations", "train_seconds", "gaussians", "device"}
    assert metrics["iterations"] == 30
    assert len(read_ply(out / "splats.ply")) == metrics["gaussians"]
    r = run_cli("train", tiny_scene, "--out", out, "--iters", 40, "--device", "cpu", "--resume")
    assert r.returncode == 0, r.stderr
    assert "resuming at step 30" in r.stderr
    assert json.loads((out / "metrics.json").read_text())["iterations"] == 40

    r = run_cli("render", out / "splats.ply", "--cameras", tiny_scene / "transforms_test.json",
                "--out", tmp_path / "views", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "views").iterdir()) == ["r_0.png", "r_1.png", "r_2.png"]


def _unreadable(scene):
    (scene / "train" / "r_4.png").write_bytes(b"not a PNG")


def _singular(scene):
    path = scene / "transforms_train.json"
    meta = json.loads(path.read_text())
    meta["frames"][1]["transform_matrix"] = [[0] * 4, [0] * 4, [0] * 4, [0, 0, 0, 1]]
    path.write_text(json.dumps(meta))


def test_cli_train_starts_from_the_scenes_points(tiny_scene, tmp_path):
    rng = np.random.default_rng(0)
    write_points(tiny_scene / POINTS_FILE, rng.uniform(-0.5, 0.5, (150, 3)), rng.integers(0, 256, (150, 3)))
    r = run_cli("train", tiny_scene, "--out", tmp_path / "a", "--iters", 5, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "starting from the 150 points" in r.stderr
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["gaussians"] == 150
    r = run_cli("train", tiny_scene, "--out", tmp_path / "b", "--iters", 5, "--device", "cpu", "--random-init",
                "--init-points", 70)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["gaussians"] == 70


@pytest.mark.parametrize("breakage, message", [
    (None, "missing: not found; give the scene folder (the one holding transforms_train.json or transforms.json, or a "
             "COLMAP capture's, holding sparse/0/ and images/)"),
    (_unreadable, "r_4.png: cannot read image"),
    (_singular, "frame 1: matrix is singular"),
])
def test_cli_errors_are_one_line(tiny_scene, tmp_path, breakage, message):
    scene = tiny_scene if breakage else tmp_path / "missing"
    if breakage:
        breakage(scene)
    r = run_cli("train", scene, "--out", tmp_path / "o", "--iters", 5, "--device", "cpu")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr


def test_cli_info():
    r = run_cli("info")
    assert r.returncode == 0, r.stderr
    assert "torch" in r.stdout and "cuda_rasterizer" in r.stdout


def test_foreign_and_older_checkpoints_are_refused_saying_why(tiny_scene, tmp_path):
    trainer = Trainer(load_split(tiny_scene, "train"), small_config(10))
    trainer.save_checkpoint(tmp_path / "ck.pt")
    state = torch.load(tmp_path / "ck.pt", weights_only=True)
    torch.save({**state, "format": 1}, tmp_path / "old.pt")
    with pytest.raises(SplatwrightError, match="checkpoint format 1, but this version reads format 2; train again"):
        load_checkpoint(tmp_path / "old.pt")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    with pytest.raises(SplatwrightError, match="not a Splatwright checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(SplatwrightError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path / "text.pt")


def test_the_loss_and_scores_of_a_byte_target_are_those_of_its_float_version():
    """A dataset's uint8 view as target gives, on the CPU, exactly the loss, gradient and scores of the same
    target as float (v / 255)."""
    gen = torch.Generator().manual_seed(4)
    target = (torch.rand(24, 20, 3, generator=gen) * 256).clamp(max=255).to(torch.uint8)
    image = (target.float() / 255 + 0.05 * torch.randn(24, 20, 3, generator=gen)).clamp(0, 1)
    losses, grads = [], []
    for gt in (target, target.float() / 255):
        img = image.clone().requires_grad_()
        loss = photometric_loss(img, gt, 0.2)
        loss.backward()
        losses.append(loss.detach())
        grads.append(img.grad)
    assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])
    assert mean_scores([image], target[None]) == mean_scores([image], target[None].float() / 255)


def test_added_views_are_stored_quantised_at_their_own_size(tiny_scene):
    data = load_split(tiny_scene, "train")
    trainer = Trainer(data, small_config(10))
    camera = cameras_of_sizes(1, [(30, 31)])[0]
    image = torch.rand(31, 30, 3, generator=torch.Generator().manual_seed(5))
    trainer.add_view(camera, image, "new")
    assert len(trainer.data) == len(data) + 1
    assert torch.equal(trainer.data.images[-1], torch.round(255 * image).to(torch.uint8))
    assert all(torch.equal(a, b) for a, b in zip(trainer.data.images[:-1], data.images))
    trainer.train_step()


def test_cli_trains_views_of_several_sizes_from_points_with_strays_to_the_end(mixed_size_scene, tmp_path):
    scene = mixed_size_scene
    out = tmp_path / "out"
    r = run_cli("train", scene, "--out", out, "--iters", 12, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "starting from the 153 points" in r.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["iterations"] == 12 and metrics["gaussians"] == 153 and np.isfinite(metrics["psnr"])
    r = run_cli("render", out / "splats.ply", "--cameras", scene / "transforms_test.json", "--out", tmp_path / "views",
                "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert [Image.open(tmp_path / "views" / f"r_{i}.png").size for i in range(3)] == MIXED_SIZES


def test_each_step_scores_a_view_whole_at_its_own_size(mixed_size_scene, monkeypatch):
    scene = mixed_size_scene
    data = load_split(scene, "train")
    seen = []

    def loss(image, target, ssim_weight):
        seen.append((tuple(image.shape), tuple(target.shape)))
        return photometric_loss(image, target, ssim_weight)
    monkeypatch.setattr("backend.train.photometric_loss", loss)
    trainer = Trainer(data, small_config(12), gaussians=Gaussians.from_point_cloud(*scene_point_cloud(scene)[1:], 3,
                                                                                    "cpu"))
    while trainer.step < 12:
        trainer.train_step()
    assert all(image == target for image, target in seen)
    assert {target for _, target in seen} == {(h, w, 3) for w, h in MIXED_SIZES}
    assert torch.isfinite(trainer.g.means).all()



def test_the_progress_bar_shows_a_value_not_measured_yet_as_a_dash():
    import io
    import math

    from backend.tools.progress import Progress
    out = io.StringIO()
    Progress(10, "train", out).update(10, loss=math.nan, psnr=31.25)
    assert "loss -  psnr 31.25" in out.getvalue()


def test_an_unknown_flag_is_named_with_its_command(tmp_path):
    r = run_cli("train", tmp_path, "--out", tmp_path / "out", "--steps", 5)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "error: python -m backend train: unrecognized arguments: --steps 5 (--help lists the options)\n"


def test_the_zero_alpha_gradient_is_one_buffer_that_fits_every_view_size():
    from backend.render.cuda import zeros
    cpu = torch.device("cpu")
    small, large, smaller = zeros((30, 32), cpu), zeros((32, 31), cpu), zeros((31, 30), cpu)
    assert [t.shape for t in (small, large, smaller)] == [(30, 32), (32, 31), (31, 30)]
    assert not any(t.any() for t in (small, large, smaller))
    assert smaller.data_ptr() == large.data_ptr()  # a view of the grown buffer, nothing made

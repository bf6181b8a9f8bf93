"""The training kernels (cuda/training.cu) against their torch definitions, and a GPU training run.

Tolerances: the loss value relative 1e-5 and its image gradient relative L2 1e-4 against the torch loss in
float64; both for a uint8 target relative 1e-6 against the same target as float; Adam parameters after 30
float32 steps within 1e-5 of the same arithmetic in float64; the densification statistics relative 1e-6
against the torch formula. A training step's gradients without autograd (render.cuda.gradient_step) equal
autograd's bit for bit.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from blender_addon.core.client import Client
from blender_addon.core.settings import FORMATIONS, training_settings
from backend.service.engine import Engine
from backend.service.training import TrainingCopies
from backend.policy import make_config
from backend.service.server import Server
from backend.data import load_split, scene_point_cloud
from backend.gaussians import Gaussians
from backend.metrics import photometric_loss, torch_photometric_loss
from backend.optim import Adam
from backend.strategy import DefaultStrategy, DensifyConfig
from backend.train import Trainer, evaluate, load_checkpoint
from backend.render import camera_tensors, render
from helpers import orbit_cameras, random_gaussians
from backend.render.cuda import gradient_step
from backend.render.reference import RasterOutput

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (torch sees none); run on a GPU machine such as the H200"),
]

DEV = "cuda"


def rel_l2(ours, ref):
    return float(torch.linalg.vector_norm(ours.double() - ref.double()) / torch.linalg.vector_norm(ref.double()))


@pytest.mark.parametrize("height,width", [(400, 400), (37, 23), (5, 70), (1, 1)])
@pytest.mark.parametrize("ssim_weight", [0.2, 1.0])
def test_fused_loss_matches_torch(height, width, ssim_weight):
    gen = torch.Generator().manual_seed(height * 1000 + width)
    gt = torch.rand(height, width, 3, generator=gen)
    img = (gt + 0.1 * torch.randn(height, width, 3, generator=gen)).clamp(0, 1)
    img[: height // 2, : width // 3] = gt[: height // 2, : width // 3]  # |x - y| = 0: the sign is 0 there
    ref_img = img.double().requires_grad_()
    ref = torch_photometric_loss(ref_img, gt.double(), ssim_weight)
    (3.0 * ref).backward()
    ours_img = img.to(DEV).requires_grad_()
    ours = photometric_loss(ours_img, gt.to(DEV), ssim_weight)
    (3.0 * ours).backward()
    assert abs(ours.item() - ref.item()) <= 1e-5 * abs(ref.item()) + 1e-7
    assert rel_l2(ours_img.grad.cpu(), ref_img.grad) <= 1e-4


@pytest.mark.parametrize("height,width", [(400, 400), (37, 23), (1, 1)])
def test_fused_loss_of_a_byte_target_equals_its_float_version(height, width):
    """A dataset's uint8 view read by the kernels as v / 255 gives the loss and gradient of the same target as
    float32 v / 255 (divided on the CPU, correctly rounded like the kernels' division)."""
    gen = torch.Generator().manual_seed(height * 7 + width)
    target = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    as_float = target.float() / 255
    img = (as_float + 0.1 * torch.randn(height, width, 3, generator=gen)).clamp(0, 1)
    img[: height // 2, : width // 3] = as_float[: height // 2, : width // 3]  # |x - y| = 0: the sign is 0 there
    results = []
    for gt in (target, as_float):
        x = img.to(DEV).requires_grad_()
        loss = photometric_loss(x, gt.to(DEV), 0.2)
        (3.0 * loss).backward()
        results.append((loss.item(), x.grad.cpu()))
    (byte_loss, byte_grad), (float_loss, float_grad) = results
    assert abs(byte_loss - float_loss) <= 1e-6 * abs(float_loss)
    torch.testing.assert_close(byte_grad, float_grad, rtol=1e-6, atol=1e-6 * float(float_grad.abs().max()))


def test_gpu_training_on_byte_views(tiny_scene):
    """The views stay uint8 on the GPU (the fused loss reads them as they are), a view added during training
    is stored the same way, and training fits."""
    data = load_split(tiny_scene, "train")
    cfg = make_config("cuda", "cuda", training_settings(iterations=300, init_points=2000))
    cfg = replace(cfg, sh_interval=50, densify=replace(cfg.densify, start=50, every=50, stop=250,
                                                       reset_opacity_every=150))
    trainer = Trainer(data, cfg, DEV)
    assert all(image.dtype == torch.uint8 and image.is_cuda for image in trainer.data.images)
    before = evaluate(trainer.g, data, 0, cfg.background, "cuda")["psnr"]
    trainer.add_view(data.cameras[0], data.image(0), "again")
    assert trainer.data.images[-1].dtype == torch.uint8 and torch.equal(trainer.data.images[-1].cpu(), data.images[0])
    while trainer.step < cfg.iterations:
        trainer.train_step()
    after = evaluate(trainer.g, data, trainer.sh_degree, cfg.background, "cuda")["psnr"]
    assert after > before + 5, (before, after)


def test_training_copies_are_the_model_after_their_step(tiny_scene, monkeypatch):
    """A watched trainer leaves a copy of its model after each step (the newest two are kept); a frame gets the
    newest the GPU has finished, of that trainer only, and the copies go once nobody watches."""
    data = load_split(tiny_scene, "train")
    cfg = make_config("cuda", "cuda", training_settings(iterations=50, init_points=500))
    trainer = Trainer(data, cfg, DEV)
    copies = TrainingCopies()
    copies.publish(trainer)
    assert copies.copies == []  # nobody watches yet
    assert copies.finished(trainer) is None  # the asker now watches
    trainer.train_step()
    copies.publish(trainer)
    after_first = trainer.g.detached()
    trainer.train_step()  # the model moves on, the copy does not
    torch.cuda.synchronize()
    copy = copies.finished(trainer)
    assert copy.step == 1 and copy.trained
    for name, tensor in copy.g.tensors().items():
        assert torch.equal(tensor, getattr(after_first, name)), name
    for _ in range(3):
        copies.publish(trainer)
    assert len(copies.copies) == 2
    torch.cuda.synchronize()
    assert copies.finished(trainer).step == 2
    assert copies.finished(Trainer(data, cfg, DEV)) is None  # another trainer's model
    monkeypatch.setattr("backend.service.training.WATCH_SECONDS", 0.0)
    copies.finished(trainer)
    copies.publish(trainer)
    assert copies.copies == []


def test_frames_of_watched_training_are_drawn_from_its_copies(tmp_path, tiny_scene, monkeypatch):
    """Frames asked for while the server trains come from the copies training leaves (after the first, which
    makes training leave them), training goes on meanwhile, and the copies go once it stops."""
    drawn_from_a_copy = []
    finished = TrainingCopies.finished

    def spy(self, trainer):
        copy = finished(self, trainer)
        drawn_from_a_copy.append(copy is not None)
        return copy
    monkeypatch.setattr(TrainingCopies, "finished", spy)
    data = load_split(tiny_scene, "train")
    server = Server(Engine(tmp_path, DEV, "cuda"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Client("127.0.0.1", server.port) as client:
            client.call("open_session", name="watched")
            for camera, image in zip(data.cameras, data.images):
                client.add_view(camera, np.ascontiguousarray(image.numpy()[::-1]))
            client.call("start_training", iterations=1_000_000, init_points=500, checkpoint_every=0,
                        checkpoint_seconds=0)
            while not client.call("status")["gaussians"]:
                time.sleep(0.01)
            first_step = client.call("status")["step"]
            frames = [client.render(camera) for camera in data.cameras * 4]
            assert client.call("status")["step"] > first_step
            client.call("stop")
            assert server.engine.training_copies.copies == []  # they go with the training thread
        assert all(frame.shape == (32, 32, 4) and frame[..., 3].max() > 0 for frame in frames)
        assert drawn_from_a_copy[0] is False and sum(drawn_from_a_copy) >= len(frames) // 2, drawn_from_a_copy
    finally:
        server.stop()
        thread.join(30)


def test_adam_kernel_matches_the_cpu_arithmetic():
    """The kernel in float32 against the same optimizer's CPU arithmetic in float64 (which
    tests/test_train.py holds to torch.optim.Adam), for more tensors than one launch takes (ADAM_TENSORS in
    cuda/splatwright.h: 8)."""
    gen = torch.Generator().manual_seed(1)
    shapes = [(1000, 3), (1000, 15, 3), (1000,), (0, 4), (3000, 4), (7,), (2049,), (1, 3), (1025,), (10, 10)]
    kernel_params = [torch.randn(s, generator=gen).to(DEV) for s in shapes]
    cpu_params = [p.cpu().double() for p in kernel_params]
    lrs = [1e-2, 3e-3, 5e-2, 1e-3, 2e-2, 1e-2, 4e-3, 3e-2, 1e-2, 5e-3]
    kernel = Adam([{"params": [p], "lr": lr} for p, lr in zip(kernel_params, lrs)], eps=1e-15)
    cpu = Adam([{"params": [p], "lr": lr} for p, lr in zip(cpu_params, lrs)], eps=1e-15)
    for step in range(30):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        grads[1] = torch.randn(1000, 16, 3, generator=gen)[:, 1:]  # strided, as from a concatenation
        for p, g in zip(kernel_params, grads):
            p.grad = g.to(DEV)
        for p, g in zip(cpu_params, grads):
            p.grad = g.double()
        kernel.step()
        cpu.step()
    for shape, a, b in zip(shapes, kernel_params, cpu_params):
        error = float((a.cpu().double() - b).abs().max()) if a.numel() else 0.0
        assert error <= 1e-5, f"{shape}: max abs difference {error:.3g} after 30 steps"


def test_gradient_statistics_kernel_matches_torch():
    gen = torch.Generator().manual_seed(2)
    n, width, height = 5000, 640, 360
    means2d = torch.randn(n, 2, generator=gen).to(DEV).requires_grad_()
    means2d.grad = torch.randn(n, 2, generator=gen).to(DEV) * 1e-3
    radii = (torch.rand(n, generator=gen) * 10).int().to(DEV)  # about a tenth are 0: not drawn
    out = RasterOutput(None, None, None, means2d, radii)
    cuda_strategy, cpu_strategy = DefaultStrategy(DensifyConfig(), 1.0), DefaultStrategy(DensifyConfig(), 1.0)
    cpu_out = RasterOutput(None, None, None, means2d.detach().cpu().requires_grad_(), radii.cpu())
    cpu_out.means2d.grad = means2d.grad.cpu()
    for _ in range(3):
        cuda_strategy.accumulate(1, out.means2d.grad, out.radii, width, height, n)
        cpu_strategy.accumulate(1, cpu_out.means2d.grad, cpu_out.radii, width, height, n)
    torch.testing.assert_close(cuda_strategy.grad_sum.cpu(), cpu_strategy.grad_sum, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(cuda_strategy.count.cpu(), cpu_strategy.count)


def test_gpu_training_fits_and_resumes_exactly(tiny_scene, tmp_path):
    """Training on the GPU (CUDA rasterizer, fused loss, Adam and statistics, densification and an opacity
    reset) fits the scene, and, every kernel being deterministic, a run resumed from a checkpoint ends with
    exactly the model of an uninterrupted one."""
    data = load_split(tiny_scene, "train")
    cfg = make_config("cuda", "cuda", training_settings(iterations=300, init_points=2000))
    cfg = replace(cfg, sh_interval=50, densify=replace(cfg.densify, start=50, every=50, stop=250,
                                                       reset_opacity_every=150))
    straight = Trainer(data, cfg, DEV)
    before = evaluate(straight.g, data, 0, cfg.background, "cuda")["psnr"]
    while straight.step < cfg.iterations:
        straight.train_step()
    after = evaluate(straight.g, data, straight.sh_degree, cfg.background, "cuda")["psnr"]
    assert after > before + 8, (before, after)

    first = Trainer(data, cfg, DEV)
    while first.step < 120:
        first.train_step()
    first.save_checkpoint(tmp_path / "ck.pt")
    resumed = Trainer.from_checkpoint(data, load_checkpoint(tmp_path / "ck.pt"), DEV)
    while resumed.step < cfg.iterations:
        resumed.train_step()
    for name, t in straight.g.tensors().items():
        assert torch.equal(getattr(resumed.g, name), t), name


@pytest.mark.parametrize("formation", FORMATIONS)
@pytest.mark.parametrize("width,height,sh_degree", [(256, 192, 3), (203, 141, 1), (64, 48, 0)])
def test_gradients_without_autograd_equal_autograds(width, height, sh_degree, formation):
    """gradient_step gives the loss, image, screen-space gradient and every parameter's gradient of
    photometric_loss(render(...)).backward() exactly, in either image formation, and adds to gradients already
    there (views batched). Its kernels read the SH coefficients in two parts (sh_dc, and sh_rest only where the
    degree reaches it), autograd's whole rows."""
    cams = orbit_cameras(2, width, height)
    gen = torch.Generator().manual_seed(4)
    targets = [torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=gen).to(DEV) for _ in cams]
    background = torch.tensor([0.2, 0.5, 1.0], device=DEV)
    runs = []
    for without_autograd in (False, True):
        g = random_gaussians(2000, seed=3).to(DEV).requires_grad_()
        per_view = []
        for cam, target in zip(cams, targets):
            view = camera_tensors(cam, DEV)
            if without_autograd:
                per_view.append(gradient_step(g, *view, width, height, sh_degree, background, target, 0.2,
                                              formation))
                continue
            out = render(g, cam, sh_degree, background, "cuda", view, formation)
            loss = photometric_loss(out.image, target, 0.2)
            loss.backward()
            per_view.append((loss, out.image, out.means2d.grad, out.radii))
        runs.append((per_view, {k: t.grad for k, t in g.tensors().items()}))
    (autograd_views, autograd_grads), (direct_views, direct_grads) = runs
    for ours, theirs in zip(direct_views, autograd_views):
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b.detach())
    for name, grad in autograd_grads.items():
        assert torch.equal(direct_grads[name], grad), name


@pytest.mark.parametrize("formation", FORMATIONS)
def test_training_without_autograd_equals_training_through_it(tiny_scene, formation):
    """The trainer's step without autograd (a static model on the CUDA rasterizer) and the same step through
    autograd train the same model bit for bit, in either image formation, densification, opacity reset and SH
    growth included."""
    data = load_split(tiny_scene, "train")
    cfg = make_config("cuda", "cuda", training_settings(iterations=160, init_points=2000))
    cfg = replace(cfg, sh_interval=40, image_formation=formation,
                  densify=replace(cfg.densify, start=20, every=20, stop=140, reset_opacity_every=100))
    trainers = [Trainer(data, cfg, DEV) for _ in range(2)]
    assert trainers[0].without_autograd
    trainers[1].without_autograd = False
    for trainer in trainers:
        while trainer.step < cfg.iterations:
            trainer.train_step()
    assert len(trainers[0].g) != 2000  # densification ran
    for name, t in trainers[1].g.tensors().items():
        assert torch.equal(getattr(trainers[0].g, name), t), name


def test_gpu_training_on_views_of_several_sizes_equals_training_through_autograd(mixed_size_scene):
    """Views of several sizes, from points with far strays: the steps without autograd (the fused loss at each
    view's own size, one zero alpha gradient for all sizes) train the model autograd trains, bit for bit."""
    data = load_split(mixed_size_scene, "train")
    _, xyz, rgb = scene_point_cloud(mixed_size_scene)
    cfg = make_config("cuda", "cuda", training_settings(iterations=80))
    cfg = replace(cfg, sh_interval=20, densify=replace(cfg.densify, start=20, every=20, stop=70,
                                                       reset_opacity_every=50))
    trainers = [Trainer(data, cfg, DEV, Gaussians.from_point_cloud(xyz, rgb, cfg.sh_degree, DEV)) for _ in range(2)]
    assert trainers[0].without_autograd
    trainers[1].without_autograd = False
    for trainer in trainers:
        while trainer.step < cfg.iterations:
            trainer.train_step()
    assert np.isfinite(trainers[0].last["loss"])
    for name, t in trainers[1].g.tensors().items():
        assert torch.equal(getattr(trainers[0].g, name), t), name


def test_gaussians_from_a_point_cloud_built_on_the_gpu_match_the_cpu():
    """A capture's points seed training on the device that trains (the neighbour search is quadratic), a few far
    strays among them."""
    rng = np.random.default_rng(3)
    xyz, rgb = rng.normal(size=(3000, 3)).astype(np.float32), rng.integers(0, 256, (3000, 3)).astype(np.uint8)
    xyz[-3:] = [[100.0, 0.0, 0.0], [0.0, -250.0, 0.0], [0.0, 0.0, 400.0]]
    on_gpu = Gaussians.from_point_cloud(xyz, rgb, 3, DEV).to("cpu")
    on_cpu = Gaussians.from_point_cloud(xyz, rgb, 3, "cpu")
    for name, t in on_cpu.tensors().items():
        torch.testing.assert_close(getattr(on_gpu, name), t, rtol=1e-4, atol=1e-6, msg=name)

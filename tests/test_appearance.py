"""Per-photo appearance (backend/appearance.py): each training view's colour transform trains with the model and
recovers the views' exposures, stays out of the saved model, resumes exactly from a checkpoint, and is on by
default for photos (a COLMAP capture) only; the fitted protocol scores a render beyond its photo's exposure."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from backend.appearance import fit, fitted_psnr, transform
from backend.data import is_colmap, load_split
from backend.data.dataset import Dataset
from backend.data.images import quantise
from backend.formats.ply import read_ply
from backend.gaussians import Gaussians
from backend.metrics import psnr
from backend.policy import CHECKPOINT, cpu_config, make_config
from backend.render import render
from backend.tools.cli import main
from backend.train import Trainer, load_checkpoint
from blender_addon.core.settings import training_settings
from helpers import SKULL, orbit_cameras, random_gaussians, write_scene

VIEWS = 8


def exposed_scene() -> tuple[Dataset, torch.Tensor, Gaussians]:
    """Views of a small model over black, each at its own known gain per channel (0.55-0.95: none clips); the
    gains; the model."""
    model = random_gaussians(150, seed=1, sh_degree=0)
    cameras = orbit_cameras(VIEWS, 24, 24)
    gains = 0.55 + 0.4 * torch.rand(VIEWS, 3, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        images = [quantise((render(model, cam, 0, (0.0, 0.0, 0.0)).image * gain).clamp(0, 1))
                  for cam, gain in zip(cameras, gains)]
    return Dataset(cameras, images, [str(i) for i in range(VIEWS)]), gains, model


def config(steps: int, colour_transforms: bool):
    """Every view each step, no densification: the steps go to the colours."""
    return replace(cpu_config(steps), sh_degree=0, background=(0.0, 0.0, 0.0), log_every=10, batch_views=VIEWS,
                   colour_transforms=colour_transforms, lr=replace(cpu_config(steps).lr, colour_transforms=0.02))


def trained(data: Dataset, cfg, start: Gaussians) -> Trainer:
    trainer = Trainer(data, cfg, gaussians=start.detached())
    while trainer.step < cfg.iterations:
        trainer.train_step()
    return trainer


def training_psnr(trainer: Trainer) -> float:
    """The mean PSNR of the training views as the trainer renders them (its transforms where it has them)."""
    scores = []
    with torch.no_grad():
        for i, cam in enumerate(trainer.data.cameras):
            image = render(trainer.g, cam, trainer.sh_degree, trainer.background).image
            image = image if trainer.appearance is None else trainer.appearance.apply(image, i)
            scores.append(psnr(image.clamp(0, 1), trainer.data.images[i]))
    return sum(scores) / len(scores)


def test_the_transforms_recover_the_views_gains_and_fit_them_better_than_one_model_alone():
    data, gains, model = exposed_scene()
    on, off = trained(data, config(40, True), model), trained(data, config(40, False), model)
    params = on.appearance.params.detach()
    recovered = 1 + params[:, 0]
    # The model's colours and the gains trade a common factor: the gains are known up to it.
    relative = (recovered / recovered.mean(0)) / (gains / gains.mean(0))
    assert (relative - 1).abs().max() < 0.08, relative  # identity would be off by up to 36%
    assert params[:, 1].abs().max() < 0.08  # no offset was applied
    assert training_psnr(on) > training_psnr(off) + 3.0


def test_the_saved_model_holds_no_transform_and_metrics_hold_both_protocols(tmp_path):
    scene = tmp_path / "scene"
    write_scene(scene, random_gaussians(200, seed=4, sh_degree=0), orbit_cameras(6, 24, 24), "train")
    out = tmp_path / "out"
    assert main(["train", str(scene), "--out", str(out), "--device", "cpu", "--iters", "12", "--init-points", "100",
                 "--sh-degree", "0", "--appearance", "on"]) == 0
    state = load_checkpoint(out / CHECKPOINT)
    assert state["appearance"]["params"].shape == (6, 2, 3) and state["appearance"]["params"].abs().sum() > 0
    ply = read_ply(out / "splats.ply")
    for name, t in state["gaussians"].items():  # the PLY is the model, untransformed
        assert torch.equal(getattr(ply, name), t), name
    metrics = (out / "metrics.json").read_text()
    assert '"appearance": true' in metrics and '"fitted_psnr"' in metrics and '"psnr"' in metrics


def test_a_resumed_run_ends_with_the_transforms_and_model_of_an_uninterrupted_one(tmp_path):
    data, _, model = exposed_scene()
    cfg = config(8, True)
    straight = trained(data, cfg, model)
    half = Trainer(data, cfg, gaussians=model.detached())
    while half.step < 4:
        half.train_step()
    half.save_checkpoint(tmp_path / CHECKPOINT)
    resumed = Trainer.from_checkpoint(data, load_checkpoint(tmp_path / CHECKPOINT), "cpu")
    while resumed.step < cfg.iterations:
        resumed.train_step()
    assert torch.equal(resumed.appearance.params, straight.appearance.params)
    for name, t in straight.g.tensors().items():
        assert torch.equal(resumed.g.tensors()[name], t), name


def test_a_view_added_while_training_gets_its_own_transform():
    data, _, model = exposed_scene()
    cfg = replace(config(4, True), batch_views=1)
    trainer = Trainer(Dataset(data.cameras[:-1], data.images[:-1], data.names[:-1]), cfg, gaussians=model.detached())
    trainer.train_step()
    before = trainer.appearance.params.detach().clone()
    trainer.add_view(data.cameras[-1], data.image(VIEWS - 1), "new")
    assert torch.equal(trainer.appearance.params[:-1], before)
    assert torch.equal(trainer.appearance.params[-1], torch.zeros(2, 3))
    while trainer.step < 4:
        trainer.train_step()  # the optimizer's moments grew with the transforms


def test_auto_is_on_for_photos_alone(tmp_path):
    write_scene(tmp_path, random_gaussians(10, sh_degree=0), orbit_cameras(2, 8, 8), "train")
    assert is_colmap(SKULL) and not is_colmap(tmp_path)
    for chosen, photos, on in [("auto", True, True), ("auto", False, False), ("on", False, True),
                               ("off", True, False)]:
        cfg = make_config("cpu", "reference", training_settings(appearance=chosen), photos=photos)
        assert cfg.colour_transforms is on, (chosen, photos)


def test_the_fitted_protocol_scores_a_render_beyond_its_photos_exposure():
    photo = load_split(SKULL, "test", downscale=8).image(0)
    params = torch.tensor([[-0.3, -0.2, -0.25], [0.02, 0.03, 0.01]])
    exposed = transform(photo, params)  # the same scene at another exposure
    torch.testing.assert_close(fit(exposed, photo), torch.stack([1 / (1 + params[0]) - 1,
                                                                 -params[1] / (1 + params[0])]), atol=1e-4, rtol=0)
    assert psnr(exposed, photo) < 25 and fitted_psnr(exposed, photo) > 60
    assert fitted_psnr(photo.flip(1), photo) < 20  # a wrong render stays wrong

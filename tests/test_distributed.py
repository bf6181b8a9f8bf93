"""Data-parallel training (backend/distributed.py): two gloo processes on the CPU train the model that one
process trains on the same batches, bit for bit."""
from __future__ import annotations

from dataclasses import asdict, replace

import pytest
import torch

from backend.data import load_split
from backend.distributed import Group, launch
from backend.policy import cpu_config
from backend.train import TrainConfig, Trainer, load_checkpoint
from blender_addon.core.errors import SplatwrightError

STEPS = 40


def config() -> TrainConfig:
    """Two views a step, densification every 10 steps and an opacity reset, so that gradients, statistics
    and the decisions made from them all have to agree across the processes."""
    cfg = cpu_config(STEPS)
    return replace(cfg, init_points=400, sh_interval=10, log_every=10, batch_views=2,
                   densify=replace(cfg.densify, start=5, every=10, stop=STEPS, reset_opacity_every=30))


def train_and_save(group, device, scene, cfg_dict, out):
    """In each process: train, and the leader writes the checkpoint (also halfway, which gathers the
    statistics mid-run)."""
    trainer = Trainer(load_split(scene, "train"), TrainConfig.from_dict(cfg_dict), device, group=group)
    while trainer.step < STEPS:
        trainer.train_step()
        if trainer.step == STEPS // 2 + 3:
            state = trainer.state_dict()  # every process takes part in gathering the statistics
            if group.leader:
                torch.save(state, out + ".half")
    state = trainer.state_dict()
    if group.leader:
        torch.save(state, out)


def train_alone(scene, cfg: TrainConfig, device: str = "cpu") -> Trainer:
    """The same run in this process alone (its mid-run state_dict too, which must change nothing)."""
    single = Trainer(load_split(scene, "train"), cfg, device)
    while single.step < STEPS:
        single.train_step()
        if single.step == STEPS // 2 + 3:
            single.state_dict()
    return single


def test_two_processes_train_the_model_one_process_trains(tiny_scene, tmp_path):
    cfg = config()
    single = train_alone(tiny_scene, cfg)

    out = str(tmp_path / "distributed.pt")
    launch(train_and_save, 2, "cpu", str(tiny_scene), asdict(cfg), out)
    state = load_checkpoint(out)
    assert state["step"] == STEPS
    assert len(state["gaussians"]["means"]) == len(single.g) != 400  # densification ran, and agreed
    for name, t in single.g.tensors().items():  # bit for bit: a sum of two gradients has one rounding
        assert torch.equal(state["gaussians"][name], t.detach()), name
    # The statistics add the same terms in another order (per process, then across): equal to rounding.
    torch.testing.assert_close(state["strategy"]["count"], single.strategy.count, rtol=0, atol=0)
    torch.testing.assert_close(state["strategy"]["grad_sum"], single.strategy.grad_sum, rtol=1e-5, atol=1e-9)


def test_a_group_needs_a_view_per_process(tiny_scene):
    with pytest.raises(SplatwrightError, match="at least as many views per step"):
        Trainer(load_split(tiny_scene, "train"), replace(config(), batch_views=1), group=Group(0, 2))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (torch sees none); run on a GPU machine such as the H200")
def test_the_nccl_path_on_one_gpu_trains_the_model_the_plain_trainer_trains(tiny_scene, tmp_path):
    """The distributed path (NCCL, one process per GPU) on the GPUs there are; with one GPU, a group of one
    must leave the plain CUDA trainer's result unchanged."""
    cfg = replace(config(), rasterizer="cuda")
    single = train_alone(tiny_scene, cfg, "cuda")
    out = str(tmp_path / "nccl.pt")
    launch(train_and_save, 1, "cuda", str(tiny_scene), asdict(cfg), out)
    state = load_checkpoint(out)
    for name, t in single.g.tensors().items():
        assert torch.equal(state["gaussians"][name], t.detach().cpu()), name

"""Training in a group (backend/distributed.py): two gloo processes on the CPU train the model that one process
trains on the same batches, bit for bit, data-parallel and partitioned (backend/partition.py: each process holds
half of the Gaussians and sends less a step than the model), each with the training options (the image formations,
views of mixed sizes, 4D models; per-photo appearance data-parallel). One launch of two processes trains all of
them (a launch costs more than a run)."""
from __future__ import annotations

from dataclasses import asdict, replace

import pytest
import torch

from backend.data import load_split
from backend.distributed import Group, launch
from backend.policy import cpu_config
from backend.train import TrainConfig, Trainer, load_checkpoint
from blender_addon.core.errors import SplatwrightError
from helpers import MIXED_SIZES, cameras_of_sizes, orbit_cameras, random_gaussians, write_scene

STEPS = 12
SHORT = 8  # the options' runs: they share the code the standard run's densification and reset already test
INIT_POINTS = 120


def config(steps: int = STEPS, **changes) -> TrainConfig:
    """Two views a step, densification every quarter of the steps and an opacity reset, so that gradients,
    statistics and the decisions made from them all have to agree across the processes."""
    cfg = cpu_config(steps)
    return replace(cfg, init_points=INIT_POINTS, sh_interval=steps // 2, log_every=10, batch_views=2,
                   densify=replace(cfg.densify, start=5, every=steps // 4, stop=steps,
                                   reset_opacity_every=3 * steps // 4), **changes)


# The runs both ways: scene and configuration.
RUNS = {
    "standard": ("tiny", config()),
    "partitioned": ("tiny", config(parallel="partitioned")),
    "blender formation": ("tiny", config(SHORT, image_formation="blender")),
    "partitioned blender formation": ("tiny", config(SHORT, image_formation="blender", parallel="partitioned")),
    "mixed sizes": ("mixed", config(SHORT)),
    "4D": ("tiny", config(SHORT, dynamic=True)),
    "partitioned 4D": ("tiny", config(SHORT, dynamic=True, parallel="partitioned")),
    "appearance": ("tiny", config(SHORT, colour_transforms=True)),
}


def train_and_save(group, device, jobs):
    """In each process, for each job: train, and the leader writes the checkpoint (also a little past halfway,
    which gathers the statistics mid-run); each process writes the Gaussians it holds and the bytes it sent in
    the last step."""
    for scene, cfg_dict, out in jobs:
        cfg = TrainConfig.from_dict(cfg_dict)
        trainer = Trainer(load_split(scene, "train"), cfg, device, group=group)
        while trainer.step < cfg.iterations:
            sent = group.sent
            trainer.train_step()
            if trainer.step == cfg.iterations // 2 + 3:
                state = trainer.state_dict()  # every process takes part in gathering the statistics
                if group.leader:
                    torch.save(state, out + ".half")
        torch.save({"held": len(trainer.g), "sent": group.sent - sent}, f"{out}.{group.rank}")
        trainer.save_checkpoint(out)  # every process takes part, the leader writes


def train_alone(scene, cfg: TrainConfig, device: str = "cpu") -> Trainer:
    """The same run in this process alone (its mid-run state_dict too, which must change nothing)."""
    single = Trainer(load_split(scene, "train"), cfg, device)
    while single.step < cfg.iterations:
        single.train_step()
        if single.step == cfg.iterations // 2 + 3:
            single.state_dict()
    return single


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict:
    model = random_gaussians(300, seed=1, sh_degree=1)
    tiny, mixed = tmp_path_factory.mktemp("tiny"), tmp_path_factory.mktemp("mixed")
    write_scene(tiny, model, orbit_cameras(8, 20, 20), "train")
    write_scene(mixed, model, cameras_of_sizes(6, MIXED_SIZES), "train")
    return {"tiny": tiny, "mixed": mixed}


@pytest.fixture(scope="module")
def two_processes(scenes, tmp_path_factory) -> dict:
    """Every run of RUNS trained by two gloo processes: its final checkpoint, and what each process held and sent
    in the last step, by name."""
    out = tmp_path_factory.mktemp("runs")
    jobs = [(str(scenes[scene]), asdict(cfg), str(out / f"{i}.pt")) for i, (scene, cfg) in enumerate(RUNS.values())]
    launch(train_and_save, 2, "cpu", jobs)
    return {name: (load_checkpoint(job[2]), [torch.load(f"{job[2]}.{rank}") for rank in (0, 1)])
            for name, job in zip(RUNS, jobs)}


@pytest.mark.parametrize("name", RUNS)
def test_two_processes_train_the_model_one_process_trains(name, scenes, two_processes):
    scene, cfg = RUNS[name]
    single = train_alone(scenes[scene], cfg)
    state = two_processes[name][0]
    assert state["step"] == cfg.iterations
    assert type(single.g).__name__ == ("DynamicGaussians" if cfg.dynamic else "Gaussians")
    assert len(state["gaussians"]["means"]) == len(single.g) != INIT_POINTS  # densification ran, and agreed
    for key, t in single.g.tensors().items():  # bit for bit: a sum of two gradients has one rounding
        assert torch.equal(state["gaussians"][key], t.detach()), key
    if cfg.colour_transforms:  # each process's views' transforms, summed
        assert torch.equal(state["appearance"]["params"], single.appearance.params.detach())
    # The statistics add the same terms in another order (per process, then across): equal to rounding.
    torch.testing.assert_close(state["strategy"]["count"], single.strategy.count, rtol=0, atol=0)
    torch.testing.assert_close(state["strategy"]["grad_sum"], single.strategy.grad_sum, rtol=1e-5, atol=1e-9)
    if cfg.parallel == "partitioned":  # each process's statistics are whole for its own rows: the same sums
        assert torch.equal(state["strategy"]["grad_sum"], single.strategy.grad_sum)
    moments = single.optimizer.state_dict()["state"]
    for i, m in state["optimizer"]["state"].items():
        assert torch.equal(m["exp_avg"], moments[i]["exp_avg"]) and torch.equal(m["exp_avg_sq"], moments[i]["exp_avg_sq"])


def test_partitioned_processes_hold_half_the_gaussians_and_send_less_than_the_model(two_processes):
    state, processes = two_processes["partitioned"]
    total = len(state["gaussians"]["means"])
    assert [p["held"] for p in processes] != [total, total] and sum(p["held"] for p in processes) == total
    for p in processes:
        assert abs(p["held"] - total / 2) <= 0.1 * total / 2
    for p in processes:
        assert p["sent"] < model_bytes(state), (p["sent"], model_bytes(state))
    replicated, processes = two_processes["standard"]
    assert [p["sent"] for p in processes] == [model_bytes(replicated)] * 2  # data-parallel: every gradient


def model_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state["gaussians"].values())


def test_a_group_needs_a_view_per_process(scenes):
    with pytest.raises(SplatwrightError, match="at least as many views per step"):
        Trainer(load_split(scenes["tiny"], "train"), replace(config(), batch_views=1), group=Group(0, 2))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (torch sees none); run on a GPU machine such as the H200")
def test_the_nccl_path_on_one_gpu_trains_the_model_the_plain_trainer_trains(scenes, tmp_path):
    """The distributed path (NCCL, one process per GPU) on the GPUs there are; with one GPU, a group of one
    must leave the plain CUDA trainer's result unchanged."""
    cfg = replace(config(), rasterizer="cuda", batch_views=1)
    single = train_alone(scenes["tiny"], cfg, "cuda")
    out = str(tmp_path / "nccl.pt")
    launch(train_and_save, 1, "cuda", [(str(scenes["tiny"]), asdict(cfg), out)])
    state = load_checkpoint(out)
    for name, t in single.g.tensors().items():
        assert torch.equal(state["gaussians"][name], t.detach().cpu()), name

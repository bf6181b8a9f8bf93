"""The train command in several processes (gloo on the CPU): `train --gpus N --device cpu` on this host, two
torchrun "nodes" on this host, checkpoints by time resumed on another number of processes (and in the other
parallel mode) after a kill, a stop the group agrees on, and what --gpus says without CUDA. Each ends with the model one uninterrupted process
trains on the same batches, bit for bit."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from backend.distributed import free_port
from backend.policy import CHECKPOINT, cpu_config
from backend.tools.cli import main
from backend.train import load_checkpoint
from helpers import ROOT, orbit_cameras, random_gaussians, spawned_workers, wait_until, write_scene

STEPS = 16
CHECKPOINT_SECONDS = "0.05"  # of training: a killed run has checkpointed a few steps in, well before its end


def train_args(scene: Path, out: Path, *extra: str) -> list[str]:
    """A short CPU training of two views a step, checkpointed by time only where `extra` says."""
    return ["train", str(scene), "--out", str(out), "--device", "cpu", "--iters", str(STEPS), "--init-points", "120",
            "--sh-degree", "1", "--views-per-step", "2", "--checkpoint-every", "0", "--checkpoint-seconds", "0",
            *extra]


def backend(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)


def checkpoint_step(out: Path) -> int:
    return load_checkpoint(out / CHECKPOINT)["step"] if (out / CHECKPOINT).is_file() else 0


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("scene")
    write_scene(folder, random_gaussians(300, seed=1, sh_degree=1), orbit_cameras(8, 24, 24), "train")
    return folder


@pytest.fixture(scope="module")
def uninterrupted(scene, tmp_path_factory) -> dict:
    """The model one process trains without a stop."""
    out = tmp_path_factory.mktemp("alone")
    assert main(train_args(scene, out)) == 0
    return load_checkpoint(out / CHECKPOINT)["gaussians"]


def assert_model(out: Path, expected: dict) -> None:
    state = load_checkpoint(out / CHECKPOINT)
    assert state["step"] == STEPS
    for name, t in expected.items():
        assert torch.equal(state["gaussians"][name], t), name


def test_a_killed_process_ends_two_and_one_process_resumes_them(scene, uninterrupted, tmp_path):
    run = backend("backend", *train_args(scene, tmp_path, "--gpus", "2", "--checkpoint-seconds", CHECKPOINT_SECONDS))
    wait_until(lambda: checkpoint_step(tmp_path) > 0, timeout=300)
    os.kill(max(spawned_workers(run.pid)), signal.SIGKILL)
    err = run.communicate(timeout=300)[1]
    assert run.returncode == 1, err
    assert re.search(r"^error: process [01] of 2 was killed by SIGKILL, which ended the training; resume from its "
                     r"last checkpoint with --resume$", err, re.M), err
    assert 0 < checkpoint_step(tmp_path) < STEPS  # the leader's clock checkpointed the group mid-run
    assert main(train_args(scene, tmp_path, "--resume")) == 0  # one process
    assert_model(tmp_path, uninterrupted)


def test_one_process_killed_resumes_on_two_partitioned_which_stop_together_and_resume(scene, uninterrupted, tmp_path):
    alone = backend("backend", *train_args(scene, tmp_path, "--checkpoint-seconds", CHECKPOINT_SECONDS))
    wait_until(lambda: checkpoint_step(tmp_path) > 0, timeout=300)
    alone.kill()
    alone.communicate(timeout=60)
    killed_at = checkpoint_step(tmp_path)
    assert 0 < killed_at < STEPS

    two = backend("backend", *train_args(scene, tmp_path, "--resume", "--gpus", "2", "--parallel", "partitioned",
                                         "--checkpoint-seconds", CHECKPOINT_SECONDS))
    wait_until(lambda: checkpoint_step(tmp_path) > killed_at, timeout=300)
    os.killpg(two.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches every process of the group
    err = two.communicate(timeout=300)[1]
    assert two.returncode == 130, err
    stopped_at = int(re.search(r"interrupted at step (\d+); resume with --resume", err).group(1))
    assert checkpoint_step(tmp_path) == stopped_at  # both stopped at one step, and it was checkpointed
    if stopped_at < STEPS:
        assert main(train_args(scene, tmp_path, "--resume")) == 0
    assert_model(tmp_path, uninterrupted)


def test_two_torchrun_nodes_train_the_model_one_process_trains(scene, uninterrupted, tmp_path):
    port = str(free_port())
    nodes = [backend("torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                     "--master-addr", "127.0.0.1", "--master-port", port, "-m", "backend",
                     *train_args(scene, tmp_path), stdout=subprocess.DEVNULL)
             for rank in (0, 1)]
    for node in nodes:
        err = node.communicate(timeout=600)[1]
        assert node.returncode == 0, err
    assert_model(tmp_path, uninterrupted)


def test_gpus_without_cuda_says_what_it_needs(scene, tmp_path, capsys):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    assert main(["train", str(scene), "--out", str(tmp_path), "--gpus", "2"]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"error: --gpus 2: needs 2 CUDA GPUs, and torch sees (none|1); add --device cpu to train in "
                        r"2 processes on the CPU\n", err), err


def test_bench_train_gpus_reports_seconds_psnr_and_scaling(scene, tmp_path, monkeypatch):
    from backend.tools.bench import scaling
    monkeypatch.setattr(scaling, "RESULTS", tmp_path)
    monkeypatch.setattr(scaling, "cpu_config", lambda steps: replace(cpu_config(steps), init_points=120))
    rows = scaling.scaling(str(scene), 2, "cpu", "quality", 4, 0)
    assert list(rows) == ["1 process", "2 processes, data", "2 processes, partitioned"]
    assert rows["1 process"]["efficiency"] == 1.0
    for row in rows.values():
        assert row["seconds"] > 0 and 5 < row["psnr"] < 60 and row["gaussians"] == rows["1 process"]["gaussians"]
    assert rows["2 processes, partitioned"]["sent_per_step"] < rows["2 processes, data"]["sent_per_step"]
    report = next(tmp_path.glob("train-gpus-2-*.md")).read_text()
    assert "| 2 processes, partitioned |" in report and "commit" in report.splitlines()[0]

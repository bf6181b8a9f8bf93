"""`bench train`'s report: the worst test view of each run, ours over seeds, and which rows the ratios use."""
from __future__ import annotations

import torch

from backend.tools.bench import train as bench_train
from backend.train import TrainConfig, mean_scores


def row(psnr: float, seconds: float, worst_view: int = 3) -> dict:
    return {"steps": 12000, "seconds": seconds, "psnr": psnr, "ssim": 0.97, "worst_psnr": psnr - 4.0,
            "worst_view": worst_view, "gaussians": 1000, "peak_bytes": 5e8}


def test_report_over_seeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    monkeypatch.setattr(bench_train, "RESULTS", tmp_path)
    rows = {"splatwright": row(33.41, 16.0), "splatwright, seed 1": row(35.35, 17.0),
            "splatwright, seed 2": row(35.43, 18.0, worst_view=7), "splatwright, resumed at 6000": row(33.40, 16.5),
            "gsplat 1.5.3 simple_trainer": row(35.61, 160.0)}
    bench_train.report(rows, TrainConfig(iterations=12000), "quality", "interior",
                       {"splatwright": 0.52, "gsplat": 1.25})
    text = capsys.readouterr().out
    assert "warm-up in this process (its kernels loaded and run once: splatwright 0.52 s, gsplat 1.25 s;" in text
    assert "| splatwright, seed 2 | 12000 | 18.0 | 35.43 | 0.9700 | 31.43 (view 7) |" in text
    assert "ours over 3 seeds: PSNR min 33.41, mean 34.73, max 35.43 dB; time mean 17.0 s" in text
    assert "ours/gsplat 1.5.3 simple_trainer: time 0.10, PSNR -2.20 dB" in text  # the first seed's row
    assert "splatwright, resumed at 6000 vs uninterrupted: PSNR -0.010 dB" in text
    assert "seed 1 vs uninterrupted" not in text and "seed 2 vs uninterrupted" not in text
    assert [p.suffix for p in sorted(tmp_path.iterdir())] == [".json", ".md"]


def test_report_over_repeats(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    monkeypatch.setattr(bench_train, "RESULTS", tmp_path)
    rows = {"splatwright": row(33.41, 6.5), "splatwright, repeat 2": row(33.41, 6.8),
            "splatwright, repeat 3": row(33.41, 6.4)}
    bench_train.report(rows, TrainConfig(iterations=8000), "fast", "lego", {"splatwright": 4.0})
    assert "ours over 3 runs of seed 0: train s min 6.40, median 6.50, max 6.80; the same model each time" in (
        capsys.readouterr().out)
    rows["splatwright, repeat 3"] = row(33.40, 6.4)
    bench_train.report(rows, TrainConfig(iterations=8000), "fast", "lego", {"splatwright": 4.0})
    assert "the models differ: the run did not repeat" in capsys.readouterr().out


def test_one_seed_has_no_seed_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    monkeypatch.setattr(bench_train, "RESULTS", tmp_path)
    bench_train.report({"splatwright": row(34.0, 15.0)}, TrainConfig(iterations=8000), "fast", "lego",
                       {"splatwright": 0.5})
    assert "seeds" not in capsys.readouterr().out


def test_mean_scores_name_the_worst_view():
    gen = torch.Generator().manual_seed(2)
    targets = torch.rand(3, 16, 16, 3, generator=gen)
    noise = (0.01, 0.2, 0.05)  # view 1 is the worst
    images = [(t + n * torch.randn(t.shape, generator=gen)).clamp(0, 1) for t, n in zip(targets, noise)]
    scores = mean_scores(images, targets)
    assert scores["worst_view"] == 1
    assert scores["worst_psnr"] < scores["psnr"] - 5

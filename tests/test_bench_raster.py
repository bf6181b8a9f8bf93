"""bench raster's stored-model scenes (--ply), made on the CPU and drawn by the reference rasterizer: from outside the
model fills the view, from within some splats cover many tiles, as in a room captured from inside."""
from __future__ import annotations

import pytest
import torch

from backend.tools.bench import write_results
from backend.tools.bench.raster import frame_size, main, model_scenes, on_device
from backend.formats.ply import write_ply
from backend.render import reference
from backend.render.constants import TILE
from helpers import random_gaussians


def test_a_stored_model_is_seen_from_outside_and_from_within(tmp_path):
    model = random_gaussians(3000, seed=3, sh_degree=2)
    write_ply(tmp_path / "room.ply", model)
    scenes = model_scenes(tmp_path / "room.ply", 160, 96)
    assert list(scenes) == ["room outside", "room inside"]
    for name, scene in scenes.items():
        scene = on_device(scene, "cpu")
        assert scene["sh_degree"] == 2 and all(scene[k].requires_grad for k in ("means", "scales", "opacities"))
        with torch.no_grad():
            out = reference.rasterize(scene["means"], scene["quats"], scene["scales"], scene["opacities"],
                                      scene["sh"], scene["viewmat"], scene["K"], 160, 96, 2, scene["background"])
        visible = out.radii > 0
        if name == "room outside":
            assert visible.float().mean() > 0.9  # the whole model in view
        else:
            assert 0.2 < visible.float().mean() < 0.8  # what lies ahead of the centre
            assert (out.radii > 2 * TILE).sum() > 10  # splats close to the camera, each over many tiles
        assert out.alpha.mean() > 0.3  # the model, not an empty frame


def test_sizes_and_files_are_checked_before_anything_runs(tmp_path, capsys):
    assert frame_size("1920x1080") == (1920, 1080)
    (tmp_path / "model.pt").write_bytes(b"not a splat file")
    for bad in (["--size", "1920"], ["--size", "0x10"], ["--ply", str(tmp_path / "absent.ply")],
                ["--ply", str(tmp_path / "model.pt")]):
        with pytest.raises(SystemExit):
            main(bad)
        assert "error:" in capsys.readouterr().err


def test_a_second_run_in_the_same_minute_keeps_the_first_runs_results(tmp_path):
    first = write_results(tmp_path, "raster-20261202-1650-GPU", {"run": 1}, "first")
    second = write_results(tmp_path, "raster-20261202-1650-GPU", {"run": 2}, "second")
    assert second.name == "raster-20261202-1650-GPU-2"
    assert first.with_suffix(".md").read_text() == "first\n" and second.with_suffix(".md").read_text() == "second\n"

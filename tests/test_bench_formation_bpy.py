"""bench formation's 4D bar, tiny, in real Blender 5.3 (the bpy module): Cycles captures a small model moving over
three frames, a 4D model trains on that in the blender formation for a few steps (CPU), and Blender's F12 of it as
a native 4D object, put in the scene as Add Model to Scene puts one, at the first and last frames is scored beside
our render of it at times 0 and 1. The bar's own figures come from the bench's full run (bench/results)."""
import json

import pytest

from backend.formats.ply import write_ply
from backend.tools.bench import formation
from blender.runner import BLENDERS, NATIVE_SPLATS, bpy_python
from helpers import random_gaussians

pytestmark = pytest.mark.blender


def test_the_4d_bar_scores_blenders_f12_of_a_native_4d_object_beside_our_render(tmp_path):
    if not NATIVE_SPLATS:
        pytest.skip(f"no tested Blender draws splats natively (5.3 or later; tested: {', '.join(BLENDERS)})")
    write_ply(tmp_path / "model.ply", random_gaussians(300, seed=4, sh_degree=1))
    assert formation.main([
        "--model", str(tmp_path / "model.ply"), "--views", "1", "--size", "16", "--samples", "16",
        "--filter-widths", "1.5", "--train-4d", "10", "--frames", "3", "--train-views", "2", "--train-size", "16",
        "--native-samples", "32", "--init-points", "200", "--max-gaussians", "400",
        "--python", bpy_python(NATIVE_SPLATS[-1]), "--out", str(tmp_path / "out")]) == 0
    result = json.loads(next((tmp_path / "out").glob("formation-*.json")).read_text())
    moving = result["moving"]
    assert moving["train_views"] == 3 * 2 and moving["steps"] == 10
    for end in ("first", "last"):
        for transform in ("Standard", "AgX"):
            s = moving["psnr"][end][transform]
            print(end, transform, {k: round(v, 2) for k, v in s.items()})
            # Blender draws the object at the frame's time as ours draws the model at time 0 or 1: the two agree far
            # more closely than either agrees with the capture (a model of a few steps).
            assert s["cycles_vs_ours"] > 28 and s["cycles_vs_ours"] > s["ours_vs_truth"] + 8
    assert len(result["moving_bars"]) == 4
    assert "The 4D bar" in next((tmp_path / "out").glob("formation-*.md")).read_text()

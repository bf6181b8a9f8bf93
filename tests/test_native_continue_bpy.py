"""Start Training (Continue From It) in real Blender 5.3 or later (the bpy module) on a session whose native splat
object was edited in Blender (points deleted in Edit Mode and moved, the object cropped by a crop box and placed
elsewhere): what it shows, in the session's model space, is the model that training continues from, the report
says so in one line, and the object then follows the model trained on from it.
tests/blender/scenarios/native_continue.py runs in Blender."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from backend.train import load_checkpoint
from blender.runner import BLENDERS, NATIVE_SPLATS, SCENARIOS, run_scenario
from splat_helpers import SESSION, splat_model, trained_session

pytestmark = pytest.mark.blender

ITERATIONS = 40  # the session's schedule: its checkpoint holds step 1 of it
# the scenario's edit: its last DELETED points deleted, its first MOVED points moved by SHIFT
DELETED, MOVED, SHIFT = 60, 5, np.array([0.3, 0.0, -0.2], np.float32)


@pytest.fixture(scope="module", params=NATIVE_SPLATS or [None])
def continued(addon_zip, tmp_path_factory, request) -> dict:
    if request.param is None:
        pytest.skip(f"no tested Blender draws splats natively (5.3 or later; tested: {', '.join(BLENDERS)})")
    home = tmp_path_factory.mktemp(f"blender-native-continue-{request.param}")
    model = splat_model()
    trained_session(home / "sessions", model, iterations=ITERATIONS)
    result = run_scenario(SCENARIOS / "native_continue.py", home, "--zip", str(addon_zip), "--workdir",
                          str(home / "sessions"), "--out", str(home / "out"), "--session", SESSION, "--python",
                          sys.executable, timeout=300, blender=request.param)
    return {**result, "model": model, "checkpoint": load_checkpoint(home / "sessions" / SESSION / "checkpoint.pt")}


def test_training_continues_from_what_the_edited_object_shows(continued):
    """Points deleted in Edit Mode, moved, and cropped by a crop box: the points the object shows, in the session's
    model space (its points as they are, whatever its transform), are what training continues from."""
    model, kept = continued["model"], continued["edited_points"]
    assert continued["points"] == len(model) and kept == len(model) - DELETED and continued["step"] == 1
    assert not continued["edited_as_added"] and continued["edited"] == SESSION
    shown = np.load(continued["shown"])
    sent = model.means[:kept].numpy()
    sent[:MOVED] += SHIFT
    rows = {tuple(row) for row in sent}
    assert 0 < len(shown) < kept and all(tuple(row) in rows for row in shown)  # the crop box kept some
    trained = [(step, gaussians) for state, step, gaussians in continued["seen"] if step and step > 1]
    print(f"{len(model)} points, {len(model) - kept} deleted in Edit Mode, {kept - len(shown)} cropped; the "
          f"backend's Gaussians while training on: {sorted({gaussians for _, gaussians in trained})}")
    assert trained and {gaussians for _, gaussians in trained} == {len(shown)}
    finished = continued["finished"]
    assert finished["step"] == ITERATIONS and finished["gaussians"] == len(shown)
    checkpoint = continued["checkpoint"]
    assert checkpoint["step"] == ITERATIONS
    means = checkpoint["gaussians"]["means"].numpy()
    print(f"the model trained on is within {np.abs(means - shown).max():.4f} of the object's points")
    assert len(means) == len(shown) and np.abs(means - shown).max() < 0.05
    said = [line for line in continued["reports"] if "continues from the edited object" in line]
    assert said == [f"Info: training continues from the edited object {SESSION} ({len(shown):,} points) in session "
                    f"{SESSION}"], continued["reports"]
    assert not [line for line in continued["reports"] if line.startswith("Error")] and continued["errors"] == ""


def test_the_object_follows_the_model_trained_on_from_its_edit(continued):
    assert continued["followed_points"] == len(np.load(continued["shown"]))
    assert not continued["edited_after_following"]

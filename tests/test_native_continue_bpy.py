"""Start Training (Continue From It) in real Blender 5.3 or later (the bpy module) on a session whose native splat
object was edited in Blender: points deleted in Edit Mode are gone from the model that training continues from,
points moved are where they were moved to (in the session's model space, whatever the object's transform), the
report says so in one line, and the object then follows the model trained on from it.
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
MOVED, SHIFT = 5, np.array([0.3, 0.0, -0.2], np.float32)  # the scenario's: its first points moved by SHIFT


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


def test_training_continues_from_the_points_left_after_deleting_some_in_edit_mode(continued):
    model, kept = continued["model"], continued["edited_points"]
    assert continued["points"] == len(model) and kept == len(model) - 60 and continued["step"] == 1
    assert not continued["edited_as_added"] and continued["edited"] == SESSION
    trained = [(step, gaussians) for state, step, gaussians in continued["seen"] if step and step > 1]
    print(f"{len(model)} points, {len(model) - kept} deleted in Edit Mode; the backend's Gaussians while training "
          f"on: {sorted({gaussians for _, gaussians in trained})}")
    assert trained and {gaussians for _, gaussians in trained} == {kept}
    finished = continued["finished"]
    assert finished["step"] == ITERATIONS and finished["gaussians"] == kept
    checkpoint = continued["checkpoint"]
    assert checkpoint["step"] == ITERATIONS
    means = checkpoint["gaussians"]["means"].numpy()
    assert len(means) == kept
    sent = model.means[:kept].numpy()
    sent[:MOVED] += SHIFT
    print(f"the model trained on is within {np.abs(means - sent).max():.4f} of the object's points")
    assert np.abs(means - sent).max() < 0.05  # trained on from the points kept, where they were moved to, in the
    # session's model space, not where the object places them
    said = [line for line in continued["reports"] if "continues from the edited object" in line]
    assert said == [f"Info: training continues from the edited object {SESSION} ({kept:,} points) in session "
                    f"{SESSION}"], continued["reports"]
    assert not [line for line in continued["reports"] if line.startswith("Error")] and continued["errors"] == ""


def test_the_object_follows_the_model_trained_on_from_its_edit(continued):
    assert continued["followed_points"] == continued["edited_points"]
    assert not continued["edited_after_following"]

"""Native splats in real Blender 5.3 or later (the bpy module): Add Model to Scene makes a GAUSSIAN_SPLAT object
whose point count and attributes are the backend's model in Blender's conventions, the same attributes Blender's
own PLY importer makes of the backend's export; Export Splats writes what it shows; it follows the model as
training moves on; and Cycles renders it with no compositor set-up and no backend.
tests/blender/scenarios/native.py runs in Blender."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from blender_addon.core.splats import read_ply_bytes
from blender_addon.logic.native import BASE, POSITION, ROTATION, SCALE, sh_attribute, to_attributes
from backend.formats import encode_any, read_any
from backend.formats.ply import encode_ply
from backend.placement import placed
from blender.runner import BLENDERS, NATIVE_SPLATS, SCENARIOS, run_scenario
from splat_helpers import SESSION, png, splat_model, trained_session

pytestmark = pytest.mark.blender

SCENARIO = SCENARIOS / "native.py"


def attributes(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name.replace("__", ":"): data[name] for name in data.files}


@pytest.fixture(scope="module", params=NATIVE_SPLATS or [None])
def native(addon_zip, tmp_path_factory, request) -> dict:
    if request.param is None:
        pytest.skip(f"no tested Blender draws splats natively (5.3 or later; tested: {', '.join(BLENDERS)})")
    home = tmp_path_factory.mktemp(f"blender-native-{request.param}")
    model = splat_model()
    trained_session(home / "sessions", model)
    result = run_scenario(SCENARIO, home, "--zip", str(addon_zip), "--workdir", str(home / "sessions"), "--session",
                          SESSION, "--out", str(home / "out"), "--python", sys.executable, timeout=300,
                          blender=request.param)
    assert "failure" not in result, result
    return {**result, "model": model}


def test_the_object_holds_the_backends_model_in_blenders_conventions(native):
    model = native["model"]
    expected = to_attributes(read_ply_bytes(encode_ply(model)))
    ours = attributes(native["ours"])
    assert native["type"] == "POINTCLOUD" and native["data_type"] == "GAUSSIAN_SPLAT"
    assert native["points"] == len(model) and set(ours) == set(expected)
    assert np.array_equal(ours[POSITION], model.means.numpy())  # exact: the points are the model's means
    np.testing.assert_allclose(ours[SCALE], np.exp(model.log_scales.numpy()), rtol=1e-6)
    np.testing.assert_allclose(ours[ROTATION], torch.nn.functional.normalize(model.quats, dim=-1).numpy(), rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_allclose(ours[BASE][:, 3], torch.sigmoid(model.opacity_logits).numpy(), rtol=1e-6)
    for name in (BASE, sh_attribute(0), sh_attribute(2)):
        np.testing.assert_allclose(ours[name], expected[name], rtol=1e-6)
    assert np.array_equal(np.array(native["matrix_world"]), np.eye(4))


def test_blenders_own_import_of_our_export_is_the_same_object(native):
    ours, blenders = attributes(native["ours"]), attributes(native["blenders"])
    assert set(ours) == set(blenders)
    for name in ours:
        np.testing.assert_allclose(ours[name], blenders[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_export_writes_what_the_object_shows(native):
    """Moved, turned and scaled, in world space: the backend's own placement of the model (as SPZ, both
    through the same encoding); with points taken away: the points left."""
    model = native["model"]
    world = read_any(native["exports"]["world.spz"])
    expected = read_any(encode_any(placed(model, np.array(native["placement"])), "spz"))
    assert len(world) == len(model)
    for name in ("means", "log_scales", "quats", "sh_dc", "sh_rest"):
        np.testing.assert_allclose(getattr(world, name), getattr(expected, name), atol=2e-3, err_msg=name)
    kept = read_ply_bytes(open(native["exports"]["kept.ply"], "rb").read())
    assert len(kept) == 200
    assert np.array_equal(kept.means, model.means[:200].numpy())
    np.testing.assert_allclose(kept.log_scales, model.log_scales[:200].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kept.opacity_logits, model.opacity_logits[:200].numpy(), rtol=1e-4, atol=1e-4)


def test_the_object_follows_the_model_as_training_moves_it_on(native):
    followed = native["followed"]
    assert followed["step"] > 1 and followed["object_step"] == followed["step"]
    assert followed["points"] == followed["gaussians"]  # the points taken away before came back with the model


def test_cycles_renders_the_object_without_a_compositor_or_a_backend(native):
    hidden, shown = png(native["hidden"]), png(native["shown"])
    assert (np.abs(shown - hidden).max(-1) > 0.05).sum() > 50
    assert native["errors"] == "" and not [line for line in native["reports"] if line.startswith("Error")]

"""A native splat object's model kept in a file outside the .blend, in real Blender 5.3 or later (the bpy module):
Keep Outside .blend writes the object's model as a 3DGS PLY beside the saved .blend and links the object to it by
a relative path; the .blend saved then is smaller by the model, and reopened, the object shows exactly the model
(Blender's Import PLY node reads the file), exports it, is cropped by a crop box and no longer follows training;
Store in .blend brings the model back into its cloud; a missing file is reported once and shows nothing; Import
Splats with Link File shows a PLY or an SPZ with no backend. tests/blender/scenarios/native_linked.py runs in
Blender."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from backend.formats import read_any
from backend.formats.ply import encode_ply
from blender_addon.core.splats import read_ply_bytes
from blender_addon.logic.native import POSITION, to_attributes
from blender.runner import BLENDERS, NATIVE_SPLATS, SCENARIOS, run_scenario
from splat_helpers import SESSION, splat_model, trained_session

pytestmark = pytest.mark.blender

SPZ = Path(__file__).resolve().parent / "data" / "splats" / "donut3k.spz"


def attributes(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name.replace("__", ":"): data[name] for name in data.files}


@pytest.fixture(scope="module", params=NATIVE_SPLATS or [None])
def kept(addon_zip, tmp_path_factory, request) -> dict:
    if request.param is None:
        pytest.skip(f"no tested Blender draws splats natively (5.3 or later; tested: {', '.join(BLENDERS)})")
    home = tmp_path_factory.mktemp(f"blender-linked-{request.param}")
    model = splat_model()
    trained_session(home / "sessions", model)
    result = run_scenario(SCENARIOS / "native_linked.py", home, "--zip", str(addon_zip), "--workdir",
                          str(home / "sessions"), "--session", SESSION, "--out", str(home / "out"), "--python",
                          sys.executable, timeout=300, blender=request.param)
    return {**result, "model": model, "out": home / "out"}


def assert_model(shown: dict, model) -> None:
    expected = to_attributes(read_ply_bytes(encode_ply(model)))
    assert set(shown) == set(expected)
    assert np.array_equal(shown[POSITION], expected[POSITION])  # exact: the points are the model's means
    for name in expected:
        np.testing.assert_allclose(shown[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_keep_outside_needs_a_saved_blend_or_an_absolute_path(kept):
    assert "not saved yet" in kept["unsaved_refusal"] and "absolute path" in kept["unsaved_refusal"]


def test_the_model_goes_beside_the_blend_by_a_relative_path_and_the_blend_keeps_only_that(kept):
    assert kept["path"] == f"//{SESSION}.ply" and Path(kept["file"]) == kept["out"] / f"{SESSION}.ply"
    assert kept["own_points"] == 0
    model_bytes = kept["points"] * 4 * (3 + 3 + 4 + 4 + 3 * 3)  # position, scale, rotation, radiance:base, SH 1
    sizes = kept["sizes"]
    print(f".blend with {kept['points']} splats of SH degree 1 stored: {sizes['stored']} bytes, linked: "
          f"{sizes['linked']} bytes")
    assert sizes["stored"] - sizes["linked"] >= 0.9 * model_bytes


def test_reopened_the_linked_object_shows_the_model_and_does_not_follow_training(kept):
    r = kept["reopened"]
    assert r["path"] == f"//{SESSION}.ply" and r["own_points"] == 0 and r["modifiers"] == ["Splatwright File"]
    assert r["evaluated_type"] == "GAUSSIAN_SPLAT" and not r["followed"]
    assert_model(attributes(r["shown"]), kept["model"])
    assert "does not follow training" in r["state"] and "Store in .blend" in r["state"]
    assert "splatwright.store_in_blend" in r["buttons"]["SPLATWRIGHT_PT_model"]
    assert "splatwright.keep_outside" not in r["buttons"]["SPLATWRIGHT_PT_model"]


def test_export_and_the_crop_box_read_what_the_linked_object_shows(kept):
    exported = read_ply_bytes((kept["out"] / "export.ply").read_bytes())
    assert len(exported) == kept["points"]
    assert np.array_equal(exported.means, kept["model"].means.numpy())
    c = kept["crop"]
    assert c["modifiers"] == ["Splatwright File", "Splatwright Crop"]
    assert 0 < c["shown"] < kept["points"]


def test_store_in_blend_brings_the_model_back_and_the_object_follows_again(kept):
    s = kept["stored"]
    assert s["modifiers"] == ["Splatwright Crop"] and s["followed"]  # the crop box's modifier stays, keeping all
    assert_model(attributes(s["attributes"]), kept["model"])


def test_a_missing_file_is_reported_once_and_shows_nothing(kept):
    m = kept["missing"]
    assert m["path"] == "//gone.ply"  # chosen absolute, kept relative to the saved .blend's folder
    assert m["shown"] == 0 and len(m["reports"]) == 1 and m["reports"][0].startswith("Warning: ")
    assert "Put the file back" in m["reports"][0] and "is missing" in m["store_blocked"]
    assert not [line for line in kept["reports"] if line.startswith("Error") and "gone.ply" in line], kept["reports"]


def test_import_with_link_file_shows_a_ply_or_an_spz_without_the_backend(kept):
    linked = kept["link_file"]
    ply = linked[f"{SESSION}.ply"]
    assert ply["shown"] == kept["points"] and ply["own_points"] == 0 and ply["path"] == f"//{SESSION}.ply"
    spz = linked[SPZ.name]
    assert spz["shown"] == len(read_any(SPZ.read_bytes())) and spz["own_points"] == 0
    assert spz["path"].startswith("//")  # relative to the saved .blend's folder

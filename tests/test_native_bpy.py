"""Native splats in real Blender 5.3 or later (the bpy module): Add Model to Scene makes a GAUSSIAN_SPLAT object
whose point count and attributes are the backend's model in Blender's conventions, the same attributes Blender's
own PLY importer makes of the backend's export; Export Splats writes what it shows, its crop box's Geometry Nodes
crop and points deleted in Edit Mode included, and in world space under any affine world matrix; it follows the
model as training moves on; and Cycles renders it with no compositor set-up and no backend.
tests/blender/scenarios/native.py runs in Blender."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from blender_addon.core.splats import read_ply_bytes
from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from blender_addon.logic.native import BASE, POSITION, ROTATION, SCALE, sh_attribute, to_attributes
from blender_addon.logic.placement import crop_matrix
from backend.formats import encode_any, read_any
from backend.formats.ply import encode_ply
from backend.metrics import psnr
from backend.placement import placed
from backend.render import rasterizer_fn, render
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


def test_the_crop_box_crops_what_the_object_shows_and_what_it_exports(native):
    """Add Crop Box on a native object: its modifier keeps the points inside the box (moved, turned, scaled
    unevenly), as the backend's crop convention has it, after points were deleted in Edit Mode; Export Splats
    writes exactly those (Cropped off: all the points left); a deleted box crops nothing."""
    c, model = native["crop"], native["model"]
    left = model.means.numpy()[:c["points"] - c["deleted"]]  # Edit Mode deleted the last points
    assert c["deleted"] > 0 and c["original_points"] == len(left) and c["box_parent"] == SESSION
    assert c["modifiers"] == ["Splatwright Crop"] and c["evaluated_type"] == "GAUSSIAN_SPLAT"
    crop = crop_matrix(np.array(c["box_matrix"]), c["box_size"], np.array(c["object_matrix"]))
    in_box = np.abs(left.astype(np.float64) @ crop[:3, :3].T + crop[:3, 3]).max(-1)
    assert np.abs(in_box - 1.0).min() > 1e-5  # no point on the box's faces, where float32 rounding decides
    inside = in_box <= 1.0
    assert 20 < inside.sum() < len(left) - 20
    shown = np.load(c["shown"])
    print(f"crop box: {len(shown)} of {len(left)} points kept after {c['deleted']} deleted in Edit Mode")
    assert np.array_equal(shown, left[inside])
    cropped = read_ply_bytes(open(native["exports"]["cropped.ply"], "rb").read())
    assert len(cropped) == len(shown) and np.array_equal(cropped.means, shown)
    uncropped = read_ply_bytes(open(native["exports"]["uncropped.ply"], "rb").read())
    assert len(uncropped) == len(left) and np.array_equal(uncropped.means, left)
    assert c["shown_after_uncropped_export"] == len(shown)  # the crop is back once the export is done
    assert c["shown_without_box"] == len(left)


def test_the_sidebar_offers_each_action_on_the_object_once_crop_and_export_in_the_model_panel(native):
    """With the native object active and its model in the backend, no button is in two panels of the sidebar
    (folded ones too), and Add Crop Box and Export are in the Model panel."""
    drawn = native["crop"]["buttons"]
    where: dict[str, list[str]] = {}
    for panel, operators in drawn.items():
        for idname in operators:
            where.setdefault(idname, []).append(panel)
    assert {idname: panels for idname, panels in where.items() if len(panels) > 1} == {}, drawn
    for idname in ("splatwright.add_crop_box", "splatwright.export_splats"):
        assert where.get(idname) == ["SPLATWRIGHT_PT_model"], (idname, drawn)


def test_world_space_export_of_a_sheared_parented_object(native):
    """Under a parent scaled unevenly, turned and scaled unevenly itself, the object's world matrix shears: the
    world-space export's means are the world matrix times its points, and it renders as the model seen through
    that matrix (folded into the camera's view matrix, which needs no decomposition); a note says the SH are
    turned by the rotation part only."""
    a, model = native["affine"], native["model"]
    m = np.array(a["matrix_world"])
    linear = m[:3, :3]
    assert np.abs(linear.T @ linear - np.diag(np.diag(linear.T @ linear))).max() > 0.05  # a shear
    shown = np.load(a["shown"])
    world = read_ply_bytes(open(native["exports"]["affine_world.ply"], "rb").read())
    assert len(world) == len(shown)
    np.testing.assert_allclose(world.means, shown.astype(np.float64) @ linear.T + m[:3, 3], rtol=0, atol=1e-5)
    g = model.detached()
    g = type(g)(**{name: value[:len(shown)] for name, value in g.tensors().items()})
    assert np.array_equal(g.means.numpy(), shown)
    centre = m[:3, 3] + linear @ shown.mean(0)
    cam = Camera(look_at(centre + np.array([3.0, -3.5, 2.5]), centre), intrinsics_from_fov_x(0.7, 128, 96), 128, 96)
    with torch.no_grad():
        ours = render(read_any(native["exports"]["affine_world.ply"]), cam, 0, (1.0, 1.0, 1.0)).image
        oracle = rasterizer_fn("reference")(g.means, g.quats, torch.exp(g.log_scales), g.opacities, g.sh,
                                            torch.from_numpy(cam.w2c @ m).float(), torch.from_numpy(cam.K).float(),
                                            cam.width, cam.height, 0, (1.0, 1.0, 1.0)).image
    assert (oracle < 0.9).any(-1).float().mean() > 0.1
    print(f"world-space export of a sheared object against the model seen through its matrix: "
          f"{psnr(ours, oracle):.1f} dB")
    assert psnr(ours, oracle) >= 35.0
    assert any("scales unevenly or shears" in line for line in native["reports"]), native["reports"]

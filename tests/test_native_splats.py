"""A model as Blender's native splats (bpy-free): the PLY the backend sends read back exactly, and the point
attributes of Blender's conventions made from it and read back (blender_addon/core/splats.py,
blender_addon/logic/native.py), and which files a native object may keep its model in outside the .blend."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.splats import read_ply_bytes
from blender_addon.logic.native import (BASE, POSITION, REFRESH_SECONDS, REMOTE_REFRESH_SECONDS, ROTATION, SCALE,
                                        file_import_node, fingerprint, from_attributes, outside_file,
                                        refresh_interval, sh_attribute, to_attributes)
from backend.formats.ply import encode_ply
from helpers import random_gaussians


@pytest.mark.parametrize("sh_degree", [0, 1, 3])
def test_the_backends_ply_reads_back_exactly(sh_degree):
    g = random_gaussians(50, seed=4, sh_degree=sh_degree)
    model = read_ply_bytes(encode_ply(g))
    assert len(model) == 50 and model.sh_degree == sh_degree
    for name in ("means", "log_scales", "quats", "opacity_logits", "sh_dc", "sh_rest"):
        np.testing.assert_array_equal(getattr(model, name), getattr(g, name).numpy().reshape(getattr(model, name).shape))


def test_other_plys_are_refused_saying_why():
    ply = encode_ply(random_gaussians(5, sh_degree=1))
    with pytest.raises(SplatwrightError, match="not a PLY"):
        read_ply_bytes(b"PK\x03\x04" + ply)
    with pytest.raises(SplatwrightError, match="binary little-endian"):
        read_ply_bytes(ply.replace(b"binary_little_endian", b"ascii"))
    with pytest.raises(SplatwrightError, match="official 3DGS layout"):
        read_ply_bytes(ply.replace(b"property float nx\n", b"property float qq\n"))
    with pytest.raises(SplatwrightError, match="5 splats announced"):
        read_ply_bytes(ply[:-10])


def test_attributes_follow_blenders_conventions():
    g = random_gaussians(30, seed=2, sh_degree=2)
    model = read_ply_bytes(encode_ply(g))
    origin = np.array([0.5, -1.0, 2.0], np.float32)
    attributes = to_attributes(model, origin)
    assert set(attributes) == {POSITION, SCALE, ROTATION, BASE} | {sh_attribute(k) for k in range(8)}
    np.testing.assert_allclose(attributes[POSITION], g.means.numpy() - origin, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(attributes[SCALE], np.exp(g.log_scales.numpy()), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(attributes[ROTATION], axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(attributes[BASE][:, :3], g.sh_dc.numpy().reshape(30, 3), rtol=1e-6)
    np.testing.assert_allclose(attributes[BASE][:, 3], torch.sigmoid(g.opacity_logits).numpy(), rtol=1e-6)
    np.testing.assert_allclose(attributes[sh_attribute(5)], g.sh_rest[:, 5].numpy(), rtol=1e-6)


def test_a_native_objects_attributes_give_the_model_back():
    model = read_ply_bytes(encode_ply(random_gaussians(40, seed=7, sh_degree=3)))
    back = from_attributes(to_attributes(model, (1.0, 2.0, 3.0)), (1.0, 2.0, 3.0))
    assert back.sh_degree == 3
    np.testing.assert_allclose(back.means, model.means, atol=1e-5)
    np.testing.assert_allclose(back.log_scales, model.log_scales, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(back.opacity_logits, model.opacity_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(back.sh_rest, model.sh_rest)


def test_a_native_objects_fingerprint_tells_its_edits_from_what_was_written():
    """Points read back as they were written match; deleting, moving or cropping one does not."""
    written = to_attributes(read_ply_bytes(encode_ply(random_gaussians(40, seed=7, sh_degree=1))))[POSITION]
    moved = written.copy()
    moved[3, 0] += 1e-6
    assert fingerprint(written.copy()) == fingerprint(written)
    assert len({fingerprint(written), fingerprint(written[:-1]), fingerprint(written[1:]), fingerprint(moved),
                fingerprint(written[::-1])}) == 5


def dynamic_model():
    from helpers import moving_model
    model = moving_model(60, seed=3)
    model.time_centers = torch.rand(len(model), generator=torch.Generator().manual_seed(9))
    model.angular_velocities[:4] = 0.0  # exactly no turn
    return model


def test_a_4d_models_attributes_are_the_model_at_each_time():
    """The backend's motion PLY (its parameters at the time centres and its motion) read by the add-on, as point
    attributes evaluated at a time (logic/native.motion_at, what the Geometry Nodes modifier and the opacity
    handler compute), are DynamicGaussians.at(t) in Blender's conventions."""
    from backend.service.exports import motion_ply_bytes
    from blender_addon.core.splats import read_motion_ply_bytes
    from blender_addon.logic.native import motion_at, native_attributes
    model = dynamic_model()
    static, motion = read_motion_ply_bytes(motion_ply_bytes(model, "standard"))
    attributes = native_attributes(static, motion)
    for time in (0.0, 0.35, 1.0):
        shown, expected = motion_at(attributes, time), to_attributes(read_ply_bytes(encode_ply(model.at(time))))
        np.testing.assert_allclose(shown[POSITION], expected[POSITION], rtol=0, atol=1e-5)
        np.testing.assert_allclose(shown[ROTATION], expected[ROTATION], rtol=0, atol=1e-6)
        np.testing.assert_allclose(shown[BASE], expected[BASE], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(shown[SCALE], expected[SCALE])
    with pytest.raises(SplatwrightError, match="4D model"):
        read_ply_bytes(motion_ply_bytes(model, "standard"))
    assert read_motion_ply_bytes(encode_ply(model.at(0.0)))[1] is None


def test_a_remote_backends_model_is_followed_seldom_while_it_trains_and_at_once_after():
    assert refresh_interval(False, "training") == REFRESH_SECONDS
    assert refresh_interval(True, "training") == REMOTE_REFRESH_SECONDS > 10 * REFRESH_SECONDS
    for state in ("paused", "finished", "stopped", "idle"):
        assert refresh_interval(True, state) == REFRESH_SECONDS


def test_a_linked_file_is_imported_by_blenders_node_for_its_format():
    assert file_import_node("/a/donut.PLY") == "GeometryNodeImportPLY"
    assert file_import_node("//donut.spz") == "GeometryNodeImportSPZ"
    with pytest.raises(SplatwrightError, match="not a compressed PLY"):
        file_import_node("donut.compressed.ply")
    with pytest.raises(SplatwrightError, match="3DGS PLY .* or an SPZ"):
        file_import_node("donut.splat")


def test_a_model_kept_outside_goes_beside_the_saved_blend_unless_a_path_is_chosen():
    assert outside_file("", "splat-model", blend_saved=True) == "//splat-model.ply"
    assert outside_file("", 'a/b\\c:d?', blend_saved=True) == "//a_b_c_d_.ply"
    assert outside_file("/data/model.ply", "x", blend_saved=False) == "/data/model.ply"
    assert outside_file("//models/x.ply", "x", blend_saved=True) == "//models/x.ply"
    for chosen in ("", "//x.ply"):
        with pytest.raises(SplatwrightError, match="not saved yet: save the .blend first, or choose an absolute path"):
            outside_file(chosen, "x", blend_saved=False)
    for chosen in ("/data/x.spz", "/data/x.compressed.ply"):
        with pytest.raises(SplatwrightError, match="name the file .ply"):
            outside_file(chosen, "x", blend_saved=True)

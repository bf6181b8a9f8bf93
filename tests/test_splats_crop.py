"""Crop boxes and placements as the add-on sends them (bpy-free): the matrix from model space into a crop box's
unit cube, and the 4x4 matrices of the wire, checked as the backend receives them."""
from __future__ import annotations

import numpy as np
import pytest

from blender_addon.core import protocol
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import REQUESTS
from blender_addon.logic.placement import crop_matrix, model_to_world
from server_helpers import CAMERA, roundtrip


def turned(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    m = np.eye(4)
    m[:3, :3] = [[c, -s, 0], [s, c, 0], [0, 0, 1]]
    return m


def test_the_crop_matrix_takes_the_boxs_corners_in_model_space_to_the_unit_cube():
    model = turned(0.4) @ np.diag([2.0, 2.0, 2.0, 1.0])  # the model object: turned and scaled
    model[:3, 3] = [1.0, -2.0, 0.5]
    model = model_to_world(model, [0.1, 0.2, 0.3])
    box = model @ turned(-1.1) @ np.diag([0.5, 1.5, 0.8, 1.0])  # its crop box, scaled unevenly inside it
    box[:3, 3] += [0.2, 0.0, -0.4]
    crop = crop_matrix(box, 0.7, model)
    corners = np.array([[x, y, z, 1.0] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)])
    world = corners @ (box @ np.diag([0.7, 0.7, 0.7, 1.0])).T  # the cube the Empty draws
    in_model = world @ np.linalg.inv(model).T
    np.testing.assert_allclose(in_model @ crop.T, corners, atol=1e-12)
    with pytest.raises(SplatwrightError, match="the crop box has no size along some axis"):
        crop_matrix(box @ np.diag([1.0, 0.0, 1.0, 1.0]), 0.7, model)


def test_matrices_travel_as_arrays_and_bad_ones_are_refused():
    crop = np.arange(16.0).reshape(4, 4)
    crop[3] = [0, 0, 0, 1]
    m = roundtrip(protocol.encode_message(REQUESTS, "render", 1, {"camera": CAMERA, "model": "a", "crop": crop}))
    assert m.fields["model"] == "a" and np.array_equal(m.fields["crop"], crop)
    m = roundtrip(protocol.encode_message(REQUESTS, "export_ply", 2))
    assert m.fields == {"model": None, "crop": None, "time": None, "name": "splats.ply", "placement": None,
                        "motion": False}
    placement = turned(0.3) @ np.diag([2.0, 2.0, 2.0, 1.0])
    m = roundtrip(protocol.encode_message(REQUESTS, "export_ply", 3, {"placement": placement}))
    np.testing.assert_array_equal(m.fields["placement"], placement)
    with pytest.raises(ValueError, match=r"placement: the matrix is scaled unevenly \(1, 3, 1\) or sheared"):
        protocol.encode_message(REQUESTS, "export_ply", 4, {"placement": np.diag([1.0, 3.0, 1.0, 1.0])})
    bad = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, "1"]]
    with pytest.raises(protocol.ProtocolError, match="render: crop: expected a number, got str"):
        roundtrip(protocol.encode_header("render", 5, {"camera": CAMERA, "crop": bad}, 0))

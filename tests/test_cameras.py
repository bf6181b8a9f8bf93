import math

import numpy as np
import pytest

from blender_addon.core.cameras import (BLENDER_TO_OPENCV, Camera, check_rigid, from_blender_c2w, intrinsics,
                             intrinsics_from_fov_x, look_at)
from blender_addon.core.errors import SplatwrightError


def test_blender_camera_looking_at_origin_projects_it_to_the_principal_point():
    # A Blender camera at +Y 4 m looking at the origin: local -Z points to -Y, local +Y is world +Z.
    c2w_blender = np.array([[-1, 0, 0, 0], [0, 0, 1, 4], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=float)
    K = intrinsics_from_fov_x(0.7, 400, 300)
    cam = from_blender_c2w(c2w_blender, K, 400, 300)
    uv, z = cam.world_to_pixel(np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    assert z[0] == pytest.approx(4.0)
    np.testing.assert_allclose(uv[0], [200.0, 150.0])
    assert uv[1][1] < 150.0  # world up is image up (smaller row)
    assert uv[2][0] < 200.0  # world +X is on the camera's left when it looks along -Y


def test_look_at_matches_blender_convention_round_trip():
    c2w = look_at([3, 1, 2], [0, 0, 0])
    cam = Camera(c2w, intrinsics_from_fov_x(0.8, 64, 48), 64, 48)
    back = from_blender_c2w(c2w @ BLENDER_TO_OPENCV, cam.K, 64, 48)
    np.testing.assert_allclose(back.c2w, c2w, atol=1e-12)
    np.testing.assert_allclose(cam.w2c @ cam.c2w, np.eye(4), atol=1e-12)


def test_intrinsics_from_fov_and_pixel_centre_convention():
    K = intrinsics_from_fov_x(2 * math.atan(0.5), 100, 80)
    assert K[0, 0] == pytest.approx(100.0)
    assert (K[0, 2], K[1, 2]) == (50.0, 40.0)


def test_scaled_camera_keeps_projection_consistent():
    cam = Camera(look_at([0, -3, 1], [0, 0, 0]), intrinsics_from_fov_x(0.9, 400, 400), 400, 400)
    small = cam.scaled(0.25)
    p = np.array([[0.3, 0.2, 0.1]])
    np.testing.assert_allclose(small.world_to_pixel(p)[0], cam.world_to_pixel(p)[0] * 0.25)


@pytest.mark.parametrize("matrix, message", [
    (np.zeros((4, 4)), "last row"),
    (np.diag([1.0, 1.0, 0.0, 1.0]), "singular"),
    (np.diag([2.0, 1.0, 1.0, 1.0]), "not a proper rotation"),
    (np.diag([-1.0, 1.0, 1.0, 1.0]), "not a proper rotation"),
    (np.full((4, 4), np.nan), "NaN"),
    (np.eye(3), "4x4"),
])
def test_bad_camera_matrices_are_refused_with_a_reason(matrix, message):
    with pytest.raises(SplatwrightError, match=message):
        check_rigid(matrix, "frame 3")


def test_a_cropped_camera_sees_that_part_of_the_image():
    cam = Camera(look_at([3, -2, 1.5], [0, 0, 0]), intrinsics(90, 95, 41, 33), 80, 60)
    part = cam.cropped(20, 24, 44, 30)
    points = np.random.default_rng(0).normal(size=(50, 3))
    uv, _ = cam.world_to_pixel(points)
    uv_part, _ = part.world_to_pixel(points)
    assert np.allclose(uv_part, uv - [20, 24]) and (part.width, part.height) == (44, 30)
    with pytest.raises(SplatwrightError, match="does not fit"):
        cam.cropped(40, 0, 44, 30)

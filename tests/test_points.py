"""Point-cloud PLY (points3d.ply): round trip, foreign layouts, refusals, and training starting from it."""
from __future__ import annotations

import numpy as np
import pytest

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.points import POINTS_FILE, read_points, write_points


def test_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    xyz = rng.normal(size=(500, 3)).astype(np.float32)
    rgb = rng.integers(0, 256, size=(500, 3)).astype(np.uint8)
    write_points(tmp_path / POINTS_FILE, xyz, rgb)
    back_xyz, back_rgb = read_points(tmp_path / POINTS_FILE)
    assert np.array_equal(back_xyz, xyz) and np.array_equal(back_rgb, rgb)


def test_reads_binary_with_normals_and_ascii_with_float_colours(tmp_path):
    binary = np.zeros(2, dtype=[("x", "<f8"), ("y", "<f8"), ("z", "<f8"), ("nx", "<f4"), ("ny", "<f4"),
                                ("nz", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    binary["x"], binary["z"], binary["red"], binary["blue"] = [1.5, -2.0], [3.0, 4.0], [255, 7], [0, 9]
    header = ("ply\nformat binary_little_endian 1.0\ncomment written elsewhere\nelement vertex 2\n"
              "property double x\nproperty double y\nproperty double z\nproperty float nx\nproperty float ny\n"
              "property float nz\nproperty uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n")
    (tmp_path / "b.ply").write_bytes(header.encode() + binary.tobytes())
    xyz, rgb = read_points(tmp_path / "b.ply")
    assert xyz.tolist() == [[1.5, 0.0, 3.0], [-2.0, 0.0, 4.0]] and rgb.tolist() == [[255, 0, 0], [7, 0, 9]]

    (tmp_path / "a.ply").write_text("ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\n"
                                    "property float z\nproperty float red\nproperty float green\nproperty float blue\n"
                                    "end_header\n0 1 2 1.0 0.5 0\n3 4 5 0 0 0.2\n")
    xyz, rgb = read_points(tmp_path / "a.ply")
    assert xyz.tolist() == [[0, 1, 2], [3, 4, 5]] and rgb.tolist() == [[255, 128, 0], [0, 0, 51]]

    (tmp_path / "grey.ply").write_text("ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\n"
                                       "property float y\nproperty float z\nend_header\n1 2 3\n")
    assert read_points(tmp_path / "grey.ply")[1].tolist() == [[128, 128, 128]]


@pytest.mark.parametrize("content,message", [
    (b"not a ply", "not a PLY file"),
    (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nend_header\n1 2\n", "missing z"),
    (b"ply\nformat binary_little_endian 1.0\nelement vertex 3\nproperty float x\nproperty float y\n"
     b"property float z\nend_header\n" + bytes(12), "file ends after 1"),
    (b"ply\nformat binary_big_endian 1.0\nelement vertex 0\nproperty float x\nproperty float y\n"
     b"property float z\nend_header\n", "binary_big_endian is not supported"),
    (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty list uchar int vertex_indices\nend_header\n", "not a plain"),
    (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nproperty float z\n"
     b"end_header\n1 nan 3\n", "NaN"),
])
def test_refuses_what_it_cannot_read_saying_why(tmp_path, content, message):
    (tmp_path / "bad.ply").write_bytes(content)
    with pytest.raises(SplatwrightError, match=message):
        read_points(tmp_path / "bad.ply")

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

from blender_addon.core.errors import SplatwrightError
from backend.formats.ply import read_ply, write_ply
from backend.render import render
from helpers import DONUT, orbit_cameras, random_gaussians


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_write_read_round_trips_exactly(tmp_path, degree):
    g = random_gaussians(257, seed=degree, sh_degree=degree)
    write_ply(tmp_path / "s.ply", g)
    back = read_ply(tmp_path / "s.ply")
    assert back.max_sh_degree == degree
    for name, t in g.tensors().items():
        assert torch.equal(getattr(back, name), t), name


def test_layout_is_the_official_3dgs_one(tmp_path):
    g = random_gaussians(4, sh_degree=3)
    write_ply(tmp_path / "s.ply", g)
    names = [p.name for p in PlyData.read(str(tmp_path / "s.ply"))["vertex"].properties]
    assert names[:9] == ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    assert names[9:54] == [f"f_rest_{i}" for i in range(45)]
    assert names[54:] == ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    # f_rest is channel-major: the first 15 columns are red's coefficients.
    v = PlyData.read(str(tmp_path / "s.ply"))["vertex"]
    assert v["f_rest_1"][0] == g.sh_rest[0, 1, 0].item()
    assert v["f_rest_15"][0] == g.sh_rest[0, 0, 1].item()


@pytest.mark.skipif(not DONUT.is_file(), reason="shared/data/splats/donut_sh0.ply not present")
def test_third_party_degree0_file_without_normals_loads_and_renders():
    g = read_ply(DONUT)
    assert len(g) > 1000 and g.max_sh_degree == 0
    center = g.means.mean(0).numpy()
    radius = float((g.means - g.means.mean(0)).norm(dim=1).quantile(0.9)) * 3
    cams = orbit_cameras(1, 64, 48, radius=radius)
    cam = cams[0]
    cam.c2w[:3, 3] += center
    with torch.no_grad():
        out = render(g, cam, 0, (1.0, 1.0, 1.0))
    assert out.image.shape == (48, 64, 3)
    assert out.alpha.max() > 0.5  # the donut is in view and opaque somewhere


def _write_vertices(path, columns: dict, count=None):
    n = len(next(iter(columns.values())))
    v = np.empty(n, dtype=[(k, "f4") for k in columns])
    for k, a in columns.items():
        v[k] = a
    PlyData([PlyElement.describe(v, "vertex")]).write(str(path))


def _valid_columns(n=3):
    cols = {k: np.zeros(n, np.float32) for k in
            ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
             "rot_0", "rot_1", "rot_2", "rot_3"]}
    cols["rot_0"][:] = 1
    return cols


def test_minimal_columns_are_accepted(tmp_path):
    _write_vertices(tmp_path / "ok.ply", _valid_columns())
    assert len(read_ply(tmp_path / "ok.ply")) == 3


def test_missing_columns_are_named(tmp_path):
    cols = _valid_columns()
    del cols["scale_1"], cols["opacity"]
    _write_vertices(tmp_path / "m.ply", cols)
    with pytest.raises(SplatwrightError, match="missing columns: opacity, scale_1"):
        read_ply(tmp_path / "m.ply")


def test_nan_values_are_refused(tmp_path):
    cols = _valid_columns()
    cols["y"][1] = np.nan
    _write_vertices(tmp_path / "n.ply", cols)
    with pytest.raises(SplatwrightError, match="NaN or infinite means .*row 1"):
        read_ply(tmp_path / "n.ply")


def test_wrong_vertex_count_is_refused(tmp_path):
    write_ply(tmp_path / "s.ply", random_gaussians(10, sh_degree=0))
    data = (tmp_path / "s.ply").read_bytes().replace(b"element vertex 10", b"element vertex 12")
    (tmp_path / "t.ply").write_bytes(data)
    with pytest.raises(SplatwrightError, match="vertex count"):
        read_ply(tmp_path / "t.ply")


def test_not_a_ply_is_refused(tmp_path):
    (tmp_path / "x.ply").write_text("hello")
    with pytest.raises(SplatwrightError, match="not a PLY"):
        read_ply(tmp_path / "x.ply")


def test_odd_sh_column_count_is_refused(tmp_path):
    cols = _valid_columns()
    cols.update({f"f_rest_{i}": np.zeros(3, np.float32) for i in range(5)})
    _write_vertices(tmp_path / "r.ply", cols)
    with pytest.raises(SplatwrightError, match="5 f_rest"):
        read_ply(tmp_path / "r.ply")


def test_zero_quaternion_is_refused(tmp_path):
    cols = _valid_columns()
    cols["rot_0"][2] = 0
    _write_vertices(tmp_path / "q.ply", cols)
    with pytest.raises(SplatwrightError, match="zero quaternions"):
        read_ply(tmp_path / "q.ply")
